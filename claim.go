package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// candidate is a due entry read from an index: a hint, not a truth.
type candidate struct {
	shard int
	id    string
	index string // idxReady or idxLeased
}

// maxClaimRounds bounds how often one Claim re-reads the indexes after
// every candidate it tried was taken by someone else. A round that failed
// jobs with no attempt left, or put wrong hints right, made room: rounds
// go on then, up to maxClearRounds, so that dead jobs ahead of a runnable
// one do not make the queue look empty.
const (
	maxClaimRounds = 4
	maxClearRounds = 64
)

// Claim takes one due job for worker: a pending job whose RunAt has come, or
// an active job whose lease expired. The job becomes active under a lease of
// Config.Lease, with Attempt incremented and LeaseOwner = worker. It costs
// three round trips when uncontended: the due entries, then WATCH+GET, then
// EXEC. It returns ErrNoJob when nothing is due.
//
// Claimers pick at random among the first Config.ClaimWindow due entries, so
// they rarely race for one job; a claimer that loses a race moves on to
// another entry instead of retrying the lost one.
func (q *Queue) Claim(ctx context.Context, worker string) (*Job, error) {
	if err := validOwner(worker); err != nil {
		return nil, err
	}
	if q.claims == nil {
		return q.claimAlone(ctx, worker, nil)
	}
	return q.claims.do(ctx, worker)
}

// claimAlone is one caller's claim: the due entries, then one candidate at
// a time under WATCH until one is taken. gone, when not nil, says that the
// caller gave up: no job is taken for it then.
func (q *Queue) claimAlone(ctx context.Context, worker string, gone func() bool) (*Job, error) {
	left := func() bool { return gone != nil && gone() }
	cleared := false
	for round := 0; round < maxClaimRounds || cleared && round < maxClearRounds; round++ {
		if left() {
			return nil, ErrNoJob
		}
		cands, err := q.dueCandidates(ctx)
		if err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			break
		}
		rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		cleared = false
		for _, c := range cands {
			if left() {
				return nil, ErrNoJob // answered already; nothing more to do for it
			}
			j, wrote, err := q.tryClaim(ctx, c, worker, gone)
			switch {
			case err == nil && j != nil:
				return j, nil
			case errors.Is(err, ErrConflict):
				// Someone else changed it first.
			case err == nil:
				// Not claimable. If it was failed (no attempt left) or its
				// hint was put right, the next round finds others behind it.
				cleared = cleared || wrote
			default:
				return nil, err
			}
		}
	}
	return nil, ErrNoJob
}

// flushClaims serves a batch of concurrent Claim calls: each round, one read
// of the due entries and one compare-and-set hand callers different jobs,
// each decided under its own WATCH. Callers left without a job get
// ErrNoJob after maxClaimRounds.
func (q *Queue) flushClaims(ctx context.Context, batch []*call[string, *Job]) {
	batch = live(batch)
	switch len(batch) {
	case 0:
		return
	case 1:
		c := batch[0]
		c.finish(q.claimAlone(ctx, c.in, c.gone))
		return
	}
	workers := make([]string, len(batch))
	for i, c := range batch {
		workers[i] = c.in
	}
	got, err := q.claimBatch(ctx, workers, func(i int) bool { return batch[i].gone() })
	for i, c := range batch {
		switch {
		case got[i] != nil:
			c.finish(got[i], nil)
		case err != nil:
			c.finish(nil, err)
		default:
			c.finish(nil, ErrNoJob)
		}
	}
}

// claimBatch claims a job for each of workers, in rounds of one read of the
// due entries and one compare-and-set; got[i] is workers[i]'s job, or nil.
//
// Batches of concurrent claimers collide easily: a WATCH on 32 keys aborts
// if any one of them is taken meanwhile. So each round reads a window four
// times the size it needs and takes a random contiguous block of it
// (claimers then overlap only when their blocks do), and a round whose EXEC
// was aborted is not retried as is: the next round reads the indexes again,
// where the jobs others took are gone. gone(i), when not nil, says that
// the caller of workers[i] gave up: no job is taken for it. The jobs of
// rounds that committed are returned even when a later round fails.
func (q *Queue) claimBatch(ctx context.Context, workers []string, gone func(i int) bool) ([]*Job, error) {
	got := make([]*Job, len(workers))
	waiting := make([]int, len(workers))
	for i := range waiting {
		waiting[i] = i
	}
	cleared := false
	for round := 0; len(waiting) > 0 && (round < maxClaimRounds || cleared && round < maxClearRounds); round++ {
		if gone != nil {
			waiting = slices.DeleteFunc(waiting, gone)
			if len(waiting) == 0 {
				break
			}
		}
		cands, err := q.dueCandidatesN(ctx, max(q.cfg.ClaimWindow, 8*len(waiting)))
		if err != nil {
			return got, err
		}
		if q.cluster() && len(cands) > 0 {
			cands = sameShard(cands) // one transaction stays in one slot
		}
		if len(cands) == 0 {
			break
		}
		n := min(len(cands), len(waiting))
		start := rand.N(len(cands) - n + 1)
		block := cands[start : start+n]
		names := make([]string, n)
		for k := range block {
			names[k] = workers[waiting[k]]
		}
		var left func(k int) bool
		if gone != nil {
			ws := slices.Clone(waiting[:n])
			left = func(k int) bool { return gone(ws[k]) }
		}
		claimed, wrote, err := q.claimTxn(ctx, block, names, true, left)
		switch {
		case errors.Is(err, ErrConflict):
			continue
		case err != nil:
			return got, err
		}
		cleared = wrote && !slices.ContainsFunc(claimed, func(j *Job) bool { return j != nil })
		var still []int
		for k, w := range waiting {
			if k < n && claimed[k] != nil {
				got[w] = claimed[k]
			} else {
				still = append(still, w)
			}
		}
		waiting = still
	}
	return got, nil
}

// untilDue returns how long until the next job becomes claimable by
// Redis's clock, read in the same round trip: the earliest score in ready
// or leased over all shards. ok is false when the queue holds none.
func (q *Queue) untilDue(ctx context.Context) (wait time.Duration, ok bool, err error) {
	var cmds []*redis.ZSliceCmd
	var clock *redis.TimeCmd
	sent := q.clock.local()
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if !q.cluster() {
			// On a cluster TIME would go to a node at random, perhaps one
			// that is down; the compare-and-sets keep the estimate fresh.
			clock = p.Time(ctx)
		}
		for s := range q.ks.shards {
			if q.down.has(s) {
				continue
			}
			cmds = append(cmds, p.ZRangeWithScores(ctx, q.ks.index(s, idxReady), 0, 0),
				p.ZRangeWithScores(ctx, q.ks.index(s, idxLeased), 0, 0))
		}
		return nil
	})
	// A shard that cannot be read (its node is down) is left out: the
	// others still say when to wake.
	if err := unanswered(all, err); err != nil || ctx.Err() != nil {
		return 0, false, fmt.Errorf("jobkey: read next due time: %w", cmp.Or(err, ctx.Err()))
	}
	now, _ := q.clock.estimate()
	if clock != nil && clock.Err() == nil {
		now = q.clock.observe(clock.Val(), sent, q.clock.local())
	}
	var next time.Time
	for _, c := range cmds {
		if z := c.Val(); len(z) == 1 {
			if t := fromMillis(int64(z[0].Score)); next.IsZero() || t.Before(next) {
				next = t
			}
		}
	}
	if next.IsZero() {
		return 0, false, nil
	}
	return max(0, next.Sub(now)), true, nil
}

func validOwner(worker string) error {
	if worker == "" || len(worker) > 256 {
		return fmt.Errorf("%w: worker name must be 1..256 bytes, got %d", ErrInvalid, len(worker))
	}
	return nil
}

// dueCandidates reads the first ClaimWindow due entries of ready and the
// first expired entries of leased, of every shard, in one round trip per
// node. Reading them also shows the two indexes hold sorted sets.
func (q *Queue) dueCandidates(ctx context.Context) ([]candidate, error) {
	return q.dueCandidatesN(ctx, q.cfg.ClaimWindow)
}

// dueCandidatesN is dueCandidates with a window of n entries per index.
func (q *Queue) dueCandidatesN(ctx context.Context, n int) ([]candidate, error) {
	if q.ks.shards <= claimShards {
		return q.dueIn(ctx, n, nil)
	}
	// Many shards: look in a random few first, and in all of them only when
	// those few have nothing due, so a claim does not read every shard.
	pick := rand.Perm(q.ks.shards)[:claimShards]
	if out, err := q.dueIn(ctx, n, pick); len(out) > 0 {
		return out, err
	}
	return q.dueIn(ctx, n, nil)
}

// claimShards is how many shards a claim reads first.
const claimShards = 4

// dueIn reads the due entries of the given shards (nil: all of them).
func (q *Queue) dueIn(ctx context.Context, n int, shards []int) ([]candidate, error) {
	if shards == nil {
		shards = make([]int, q.ks.shards)
		for i := range shards {
			shards[i] = i
		}
	}
	// Shards whose node could not be reached a moment ago are left out for
	// a while, so claims on a cluster with a dead master do not wait on its
	// dial timeout every time; when every shard is out, all are tried.
	if up := slices.DeleteFunc(slices.Clone(shards), q.down.has); len(up) > 0 {
		shards = up
	}
	if err := q.check(ctx, true); err != nil {
		return nil, err
	}
	t, err := q.clock.now(ctx, q.rdb)
	if err != nil {
		return nil, err
	}
	now := strconv.FormatInt(toMillis(t), 10)
	// Read past the jobs this build cannot read (a newer major format),
	// which stay at the head of their index for the workers that can.
	window := int64(n + q.newer.size())
	type read struct {
		shard int
		index string
		due   *redis.StringSliceCmd
	}
	var reads []read
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, s := range shards {
			for _, idx := range []string{idxReady, idxLeased} {
				key := q.ks.index(s, idx)
				reads = append(reads, read{s, idx,
					p.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: now, Count: window})})
			}
		}
		return nil
	})
	if err := unanswered(cmds, err); err != nil {
		return nil, fmt.Errorf("jobkey: read due jobs: %w", err)
	}
	// A shard whose index cannot be read (the wrong type, or its cluster
	// node is down) is skipped, so the other shards' jobs keep flowing; its
	// error surfaces when nothing else is due. An ID found in two indexes
	// (a stray entry) is a candidate once: one transaction must not decide
	// about one job twice.
	var out []candidate
	var firstErr error
	broken := map[int]bool{}
	seen := map[string]bool{}
	for _, r := range reads {
		key := q.ks.index(r.shard, r.index)
		ids, err := r.due.Result()
		switch {
		case isWrongType(err):
			firstErr = cmp.Or(firstErr, error(&WrongTypeError{Key: key, Want: "zset", Got: "non-zset"}))
			broken[r.shard] = true
			continue
		case err != nil:
			firstErr = cmp.Or(firstErr, fmt.Errorf("jobkey: read %s: %w", key, err))
			broken[r.shard] = true
			if !isRedisErr(err) {
				q.down.add(r.shard)
			}
			continue
		}
		taken := 0
		for _, id := range ids {
			if !seen[id] && taken < n && !q.newer.has(id) {
				seen[id] = true
				taken++
				out = append(out, candidate{shard: r.shard, id: id, index: r.index})
			}
		}
	}
	if len(broken) > 0 {
		kept := out[:0]
		for _, c := range out {
			if !broken[c.shard] {
				kept = append(kept, c)
			}
		}
		out = kept
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// tryClaim decides on one candidate from its value under WATCH. It returns
// the claimed job, or nil when the candidate was not claimable; either way
// a hint that disagreed with its value is put right in the same EXEC. A
// lost race is returned at once (ErrConflict): the caller moves on.
func (q *Queue) tryClaim(ctx context.Context, c candidate, worker string, gone func() bool) (*Job, bool, error) {
	var left func(int) bool
	if gone != nil {
		left = func(int) bool { return gone() }
	}
	got, wrote, err := q.claimTxn(ctx, []candidate{c}, []string{worker}, true, left)
	if err != nil {
		return nil, false, err
	}
	return got[0], wrote, nil
}

// claimTxn claims every claimable candidate in one compare-and-set,
// candidate i for workers[i]; got[i] is the job claimed, or nil. The
// candidates must share a hash slot on a cluster. gone(i), when not nil,
// says that the caller of workers[i] gave up: candidate i is left alone.
// wrote says whether the transaction wrote anything (a claim, a job failed
// for good, a hint put right).
func (q *Queue) claimTxn(ctx context.Context, cands []candidate, workers []string, noRetry bool, gone func(i int) bool) (got []*Job, wrote bool, err error) {
	keys := make([]string, len(cands))
	var verified []string
	seen := map[int]bool{}
	for i, c := range cands {
		keys[i] = q.ks.jobKey(c.shard, c.id)
		if !seen[c.shard] {
			seen[c.shard] = true
			verified = append(verified, q.ks.index(c.shard, idxReady), q.ks.index(c.shard, idxLeased))
		}
	}
	got = make([]*Job, len(cands))
	var vanished []string
	var plan *casPlan
	_, plan, err = q.cas.run(ctx, &casTxn{keys: keys, verified: verified, noRetry: noRetry,
		decide: func(r *casRead) (*casPlan, error) {
			clear(got)
			vanished = vanished[:0]
			plan := &casPlan{}
			var ip indexPlan
			now := r.now
			for i, c := range cands {
				if gone != nil && gone(i) {
					continue
				}
				if errors.Is(r.errs[i], ErrUnsupportedFormat) {
					// Written by a newer jobkey: neither ours to read nor to
					// set aside. Its hint stays for the workers that can
					// read it; this one skips it for a while, and logs the
					// sighting so Stats shows a rollout that stalls.
					q.newer.add(c.id)
					ip.zadd(q.ks.index(c.shard, seenNewer), toMillis(now), c.id)
					continue
				}
				if r.errs[i] != nil {
					// The value cannot be read. Its bytes are kept untouched;
					// its hint moves to the corrupt index, so no claimer
					// trips on it again and Stats counts it.
					ip.zrem(q.ks.index(c.shard, c.index), c.id)
					ip.zadd(q.ks.index(c.shard, idxCorrupt), toMillis(now), c.id)
					continue
				}
				cur := r.jobs[i]
				next, took := q.decideClaim(cur, workers[i], now)
				switch {
				case next != nil:
					q.move(&ip, c.shard, c.id, cur, next, c.index)
					plan.writes = append(plan.writes, q.write(keys[i], next))
					if took {
						got[i] = next
					}
				case cur == nil:
					// A hint with no value: the job was deleted outside
					// jobkey, or evicted. The hint goes; the loss is logged
					// and counted (Stats.Vanished).
					q.move(&ip, c.shard, c.id, nil, nil, c.index)
					ip.zadd(q.ks.index(c.shard, seenVanished), toMillis(now), c.id)
					vanished = append(vanished, c.id)
				case derive(cur).index != c.index:
					// Not claimable, and the hint that led here disagrees
					// with the value.
					q.move(&ip, c.shard, c.id, cur, cur, c.index)
				default:
					// Same index, but the hint said due: its score may be stale.
					q.fixScore(&ip, c.shard, c.id, derive(cur), now)
				}
			}
			plan.steps, plan.checks = ip.steps(), ip.checks
			return plan, nil
		}})
	if err != nil {
		return nil, false, err
	}
	for _, id := range vanished {
		q.cfg.Logger.Error("jobkey: a job's index entry pointed at no value: the job was deleted outside jobkey, or evicted by Redis (is maxmemory-policy noeviction?)",
			"queue", q.name, "job", id)
	}
	return got, !plan.empty(), nil
}

// decideClaim says what a claim does to cur at now (Redis's clock): take it
// (a pending job that is due, or an active one whose lease expired, with
// attempts left), fail it (no attempt left), or nothing (nil).
func (q *Queue) decideClaim(cur *Job, worker string, now time.Time) (next *Job, took bool) {
	if cur == nil {
		return nil, false
	}
	due := cur.State == StatePending && !cur.RunAt.After(now)
	expired := cur.State == StateActive && !cur.LeaseUntil.After(now)
	switch {
	case (due || expired) && cur.Attempt >= cur.MaxAttempts:
		next = cloneJob(cur)
		next.State = StateFailed
		if expired {
			// The last attempt's lease ran out: the job fails for good.
			next.LastError = fmt.Sprintf("lease of attempt %d/%d (worker %q) expired before it finished", cur.Attempt, cur.MaxAttempts, cur.LeaseOwner)
		} else {
			// Pending with no attempt left: MaxAttempts was lowered below it.
			next.LastError = fmt.Sprintf("no attempt left: %d of %d made", cur.Attempt, cur.MaxAttempts)
		}
		next.UpdatedAt = now
		return next, false
	case due || expired:
		return q.claimed(cur, worker, now), true
	}
	return nil, false
}

// ClaimMany claims up to n due jobs for worker in one transaction: the due
// entries, then WATCH+GET of all of them, then one EXEC; three round trips
// when uncontended. Each job is still decided under its own WATCH, and
// every claimed job is fenced as a single Claim's is. It returns ErrNoJob
// when nothing is due.
func (q *Queue) ClaimMany(ctx context.Context, worker string, n int) ([]*Job, error) {
	if err := validOwner(worker); err != nil {
		return nil, err
	}
	if n < 1 || n > q.cfg.MaxBatch {
		return nil, fmt.Errorf("jobkey: ClaimMany of %d jobs, want 1..%d (Config.MaxBatch)", n, q.cfg.MaxBatch)
	}
	got, err := q.claimBatch(ctx, slices.Repeat([]string{worker}, n), nil)
	var out []*Job
	for _, j := range got {
		if j != nil {
			out = append(out, j)
		}
	}
	switch {
	case len(out) > 0:
		return out, nil // what was claimed is the caller's, even if a later round failed
	case err != nil:
		return nil, err
	}
	return nil, ErrNoJob
}

// sameShard keeps the candidates of the first candidate's shard.
func sameShard(cands []candidate) []candidate {
	out := cands[:0:0]
	for _, c := range cands {
		if c.shard == cands[0].shard {
			out = append(out, c)
		}
	}
	return out
}

// claimed returns cur taken by worker: active, one more attempt, leased
// under a token of its own.
func (q *Queue) claimed(cur *Job, worker string, now time.Time) *Job {
	next := cloneJob(cur)
	next.State = StateActive
	next.Attempt++
	next.LeaseOwner = worker
	next.LeaseUntil = now.Add(q.cfg.Lease)
	next.LeaseToken = newToken()
	next.UpdatedAt = now
	return next
}

// newToken draws a lease token: random, never 0.
func newToken() uint64 {
	for {
		if t := rand.Uint64(); t != 0 {
			return t
		}
	}
}

// fixScore rewrites an entry whose index is right but whose score says due
// when the value says not yet.
func (q *Queue) fixScore(p *indexPlan, shard int, id string, want entry, now time.Time) {
	if want.score > toMillis(now) {
		p.zadd(q.ks.index(shard, want.index), want.score, id)
	}
}

func orEmpty(j *Job) *Job {
	if j == nil {
		return &Job{}
	}
	return j
}

func cloneJob(j *Job) *Job {
	c := *j
	return &c
}

// downList remembers, for a while, the shards whose node could not be
// reached.
type downList struct {
	mu     sync.Mutex
	shards map[int]time.Time // shard -> when to try it again
}

// downFor is how long claims leave out a shard whose node was unreachable.
const downFor = 2 * time.Second

func (l *downList) add(shard int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shards == nil {
		l.shards = map[int]time.Time{}
	}
	l.shards[shard] = time.Now().Add(downFor)
}

func (l *downList) has(shard int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.shards[shard]
	if ok && time.Now().After(until) {
		delete(l.shards, shard)
		return false
	}
	return ok
}

// skipList remembers, for a while, the IDs of jobs this build cannot read
// because a newer jobkey wrote them, so claimers look past them.
type skipList struct {
	mu  sync.Mutex
	ids map[string]time.Time // id -> when to look at it again
}

// skipFor is how long a claimer looks past a newer-format job before it
// looks again (and logs the sighting again).
const skipFor = time.Minute

// maxSkip bounds the list; past it, the list starts over.
const maxSkip = 1000

func (l *skipList) add(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ids == nil || len(l.ids) >= maxSkip {
		l.ids = map[string]time.Time{}
	}
	l.ids[id] = time.Now().Add(skipFor)
}

func (l *skipList) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.ids[id]
	if ok && time.Now().After(until) {
		delete(l.ids, id)
		return false
	}
	return ok
}

func (l *skipList) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}
