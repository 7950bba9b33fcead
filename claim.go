package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// candidate is a due entry read from an index: a hint, not a truth.
type candidate struct {
	shard int
	id    string
	index string // a ready index (readyIndex) or idxLeased
	// prio orders candidates, higher first: the priority of the ready
	// index it came from, or leasedPrio for an expired lease.
	prio int
}

// leasedPrio ranks the expired leases of a shard: before every ready job,
// as the most overdue work; their index does not say their priority.
const leasedPrio = MaxPriority + 1

// pickBlock returns n candidates for a batch, the highest priorities first,
// and the rest. Within the top priority, when it has more than n, it takes
// a random contiguous block in index order: concurrent batches then overlap
// only when their blocks do, where random picks of n would nearly always
// share one job and abort each other's EXEC.
func pickBlock(cands []candidate, n int) (block, rest []candidate) {
	slices.SortStableFunc(cands, func(a, b candidate) int { return b.prio - a.prio })
	top := 0
	for top < len(cands) && cands[top].prio == cands[0].prio {
		top++
	}
	start := 0
	if top > n {
		start = rand.N(top - n + 1)
	}
	block = slices.Clone(cands[start : start+n])
	rest = slices.Concat(cands[:start], cands[start+n:])
	return block, rest
}

// byPriority orders candidates by priority, highest first, at random
// within a priority: claimers of one priority spread over its jobs, and a
// higher priority is always tried first.
func byPriority(cands []candidate) {
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	slices.SortStableFunc(cands, func(a, b candidate) int { return b.prio - a.prio })
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
//
// With Config.MinReplicas, a claim the replicas do not confirm is not
// handed over until a renewal of its lease is (see confirmClaims); one that
// cannot be before its lease could end is given back unrun, and Claim
// returns the *ReplicationError if it got no other job.
func (q *Queue) Claim(ctx context.Context, worker string) (*Job, error) {
	if err := validOwner(worker); err != nil {
		return nil, err
	}
	if q.claims == nil {
		return q.claimAlone(ctx, worker, nil)
	}
	return q.claims.do(ctx, worker)
}

// workClaim is Claim for a Work slot. A claim whose call a flush has
// taken is waited for even once ctx has ended: the slot then gives back
// the job it claimed before Work returns (execute), where an answer at
// ctx's end would leave that to a give-back that may outlive the process,
// and the job leased to nobody, its attempt spent.
func (q *Queue) workClaim(ctx context.Context, worker string) (*Job, error) {
	if q.claims == nil {
		return q.Claim(ctx, worker)
	}
	if err := validOwner(worker); err != nil {
		return nil, err
	}
	return q.claims.await(ctx, worker)
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
		v, pooled, err := q.candidates(ctx, round, q.cfg.ClaimWindow, anyShard)
		if err != nil {
			return nil, err
		}
		cands := v.cands
		if len(cands) == 0 {
			break
		}
		if !pooled {
			byPriority(cands) // the pool's order serves the shards in turn
		}
		cleared = false
		for k, c := range cands {
			if left() {
				return nil, ErrNoJob // answered already; nothing more to do for it
			}
			j, wrote, err := q.tryClaim(ctx, c, worker, gone)
			switch {
			case err == nil && j != nil:
				q.leftOver(v, cands[k+1:], pooled) // not tried: for the claims that follow
				q.pool.served(cands[:k+1])
				return j, nil
			case errors.Is(err, ErrConflict):
				// Someone else changed it first.
			case pooled && errors.Is(err, ErrWrongType):
				// Read ahead before its shard's index broke: the next round
				// reads the indexes, skipping broken shards.
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
		mode := anyShard
		if q.cluster() {
			mode = oneShard // one transaction stays in one slot
		}
		v, pooled, err := q.candidates(ctx, round, max(q.cfg.ClaimWindow, 8*len(waiting)), mode)
		if err != nil {
			return got, err
		}
		cands := v.cands
		if q.cluster() && len(cands) > 0 {
			// One transaction stays in one slot: the shard of the highest
			// priority's candidate, or the pool's choice.
			if !pooled {
				byPriority(cands)
			}
			cands = sameShard(cands)
		}
		if len(cands) == 0 {
			break
		}
		n := min(len(cands), len(waiting))
		var block []candidate
		if pooled {
			block = cands[:n] // in the pool's order, which serves the shards in turn
		} else {
			block, _ = pickBlock(cands, n)
		}
		// Not tried, of every shard read: for the claims that follow.
		q.leftOver(v, slices.DeleteFunc(slices.Clone(v.cands), func(c candidate) bool {
			return slices.ContainsFunc(block, func(b candidate) bool { return b.id == c.id })
		}), pooled)
		q.pool.served(block)
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
		case pooled && errors.Is(err, ErrWrongType):
			continue // read ahead before a shard's index broke: the next round reads the indexes
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

// giveBack releases j, claimed for a caller that left before the claim's
// answer reached it, so that it is not leased to nobody until its lease
// ends, spending an attempt it never ran. It runs on its own goroutine,
// bounded by the lease: the flush that claimed it goes on meanwhile. t,
// the caller's trail, counts it until it is over (Work waits for its
// own). The release is fenced on j's lease token, so it writes nothing if
// the claim did not land, or if the lease has already passed to someone
// else; if it cannot land at all, the job is claimed again once its lease
// runs out.
func (q *Queue) giveBack(t *trail, j *Job) {
	if j == nil {
		return
	}
	t.add()
	go func() {
		defer t.done()
		if err := q.releaseUnrun(context.Background(), j, time.Now().Add(q.cfg.Lease)); err != nil && !claimGone(err) {
			q.cfg.Logger.Warn("jobkey: could not give back a job claimed for a caller that left; it is claimed again when its lease ends",
				"queue", q.name, "job", j.ID, "err", err)
		}
	}()
}

// releaseUnrun gives back j, claimed for a run that never started, by a
// fenced Release retried with backoff until it lands, is refused, or until
// passes; one attempt is made however late it is asked, bounded by a tenth
// of the lease. A claim that did not land, or whose lease passed to
// another claim, is refused (claimGone): nothing is written then. A
// release the replicas did not confirm stands on the master: if a failover
// loses it, the job is claimed again once its lease runs out. ctx gives
// its values, not its end: the release is what an ended caller leaves.
func (q *Queue) releaseUnrun(ctx context.Context, j *Job, until time.Time) error {
	ctx = context.WithoutCancel(ctx)
	delay := 10 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, max(time.Until(until), q.cfg.Lease/10))
		_, err := q.Release(rctx, j)
		cancel()
		switch {
		case err == nil, errors.Is(err, ErrNotReplicated):
			return nil
		case final(err), time.Until(until) <= 0:
			return err
		}
		time.Sleep(min(delay, max(time.Until(until), 0)))
		delay = min(2*delay, q.cfg.Lease/10)
	}
}

// claimGone reports a give-back refused because there was nothing to give
// back: the claim did not land, or its job moved on.
func claimGone(err error) bool { return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) }

func validOwner(worker string) error {
	if worker == "" || len(worker) > 256 {
		return fmt.Errorf("%w: worker name must be 1..256 bytes, got %d", ErrInvalid, len(worker))
	}
	return nil
}

// candidates returns due entries to try: in the first round of a process
// whose Work runs, those the pool holds (see duePool), taken by mode
// (anyShard, oneShard), when it has some; else a read of the indexes, n
// entries per index, of every shard when the pool cannot vouch for some.
func (q *Queue) candidates(ctx context.Context, round, n, mode int) (_ dueView, pooled bool, _ error) {
	work := q.listeners.Load() > 0
	q.probeGone()
	if round == 0 && work {
		if cands := q.pool.take(n, mode); len(cands) > 0 {
			return dueView{cands: cands}, true, nil
		}
	}
	if work && !q.pool.complete() {
		// A read of a few shards would refill the pool without a job due
		// on another, or a higher priority a hint announced.
		v, err := q.dueIn(ctx, n, nil)
		return v, false, err
	}
	v, err := q.dueCandidatesN(ctx, n)
	return v, false, err
}

// leftOver gives the candidates of v a claim did not try to the claims
// that follow: back to the pool if they came from it, else as the fresh
// read of v's shards.
func (q *Queue) leftOver(v dueView, rest []candidate, pooled bool) {
	if pooled {
		q.pool.putBack(rest)
		return
	}
	v.cands = rest
	q.pool.fill(v)
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
	var checks []typeCheck
	for i, c := range cands {
		keys[i] = q.ks.jobKey(c.shard, c.id)
	}
	for _, k := range q.indexKeys(cands, idxLeased) {
		checks = append(checks, typeCheck{key: k, want: "zset"})
	}
	got = make([]*Job, len(cands))
	guards, guardOf := q.shardGuards(cands)
	shards := make([]int, len(cands))
	for i, c := range cands {
		shards[i] = c.shard
	}
	var vanished []candidate
	var plan *casPlan
	asked := time.Now() // the claims' leases are measured from here
	_, plan, err = q.cas.run(ctx, &casTxn{keys: keys, checks: checks, noRetry: noRetry, guards: guards.keys, follow: q.slotFollow(shards),
		decide: func(r *casRead) (*casPlan, error) {
			clear(got)
			vanished = vanished[:0]
			plan := &casPlan{}
			var ip indexPlan
			b := q.newSlotBook(r)
			now := r.now
			for i, c := range cands {
				if gone != nil && gone(i) || r.guarded[guardOf[i]] {
					continue // the caller left, or the shard is paused
				}
				claimed, lost := q.decideCandidate(plan, &ip, b, c, keys[i], r.jobs[i], r.errs[i], workers[i], now)
				got[i] = claimed
				if lost {
					vanished = append(vanished, c)
				}
			}
			b.finish(plan, &ip)
			plan.steps, plan.checks = ip.steps(), ip.checks
			return plan, nil
		}})
	if errors.Is(err, ErrNotReplicated) {
		// The claims stand on the master, unconfirmed: none is handed over
		// until the replicas confirm it (confirmClaims).
		claimed := slices.ContainsFunc(got, func(j *Job) bool { return j != nil })
		q.confirmClaims(ctx, got, asked, err)
		if !claimed || slices.ContainsFunc(got, func(j *Job) bool { return j != nil }) {
			err = nil // else every claim was given back unconfirmed: the caller is told why
		}
	}
	if err != nil {
		return nil, false, err
	}
	q.vanishedFound(ctx, plan, vanished)
	return got, !plan.empty(), nil
}

// vanishedFound deals with the candidates whose entry pointed at no value
// when the claim's compare-and-set read them: the EXEC removed each entry
// with a ZREM of its own and counted it in the vanished log. A ZREM that
// removed nothing means someone else removed the entry first, as Delete
// does with the value: nothing was lost, and the count is taken back. One
// that removed it found an entry whose value is gone (deleted outside
// jobkey, or evicted): that is logged.
func (q *Queue) vanishedFound(ctx context.Context, plan *casPlan, cands []candidate) {
	if plan == nil {
		return
	}
	for _, c := range cands {
		vanished := q.ks.index(c.shard, seenVanished)
		if stepReply(plan, "zrem", q.ks.index(c.shard, c.index), c.id) != 0 {
			q.cfg.Logger.Error("jobkey: a job's index entry pointed at no value: the job was deleted outside jobkey, or evicted by Redis (is maxmemory-policy noeviction?)",
				"queue", q.name, "job", c.id)
			continue
		}
		// Someone removed the hint first, as Delete does with the value:
		// nothing was lost. The count goes again if this claim made it.
		if stepReply(plan, "zadd", vanished, c.id) == 1 {
			if err := q.rdb.ZRem(ctx, vanished, c.id).Err(); err != nil {
				q.cfg.Logger.Warn("jobkey: could not take back a vanished count", "queue", q.name, "job", c.id, "err", err)
			}
		}
	}
}

// stepReply returns the integer reply of the plan's step name on key whose
// last argument is member, once EXEC answered: -1 when there is none.
func stepReply(plan *casPlan, name, key, member string) int64 {
	for _, cmd := range plan.results {
		a := cmd.Args()
		if cmd.Name() != name || len(a) < 3 || a[1] != key || a[len(a)-1] != member {
			continue
		}
		if rc, ok := cmd.(*redis.Cmd); ok {
			if n, ok := rc.Val().(int64); ok {
				return n
			}
		}
	}
	return -1
}

// decideCandidate decides what a claim does about one candidate, stored at
// key, whose value read as cur (or gave readErr): claim it for worker (the
// job returned), fail it for good, put its hint right, set an unreadable
// value aside, or skip a newer format. Its writes go to plan and ip; lost
// says the hint pointed at no value.
func (q *Queue) decideCandidate(plan *casPlan, ip *indexPlan, b *slotBook, c candidate, key string, cur *Job, readErr error,
	worker string, now time.Time) (claimed *Job, lost bool) {
	switch {
	case errors.Is(readErr, ErrUnsupportedFormat):
		// Written by a newer jobkey: neither ours to read nor to set aside.
		// Its hint stays for the workers that can read it; this one skips
		// it for a while, and logs the sighting so Stats shows a rollout
		// that stalls.
		q.newer.add(c.id)
		ip.zadd(q.ks.index(c.shard, seenNewer), toMillis(now), c.id)
		return nil, false
	case readErr != nil:
		// The value cannot be read. Its bytes are kept untouched; its hint
		// moves to the corrupt index, so no claimer trips on it again and
		// Stats counts it.
		ip.zrem(q.ks.index(c.shard, c.index), c.id)
		ip.zadd(q.ks.index(c.shard, idxCorrupt), toMillis(now), c.id)
		return nil, false
	}
	next, took := q.decideClaim(cur, worker, now)
	if next != nil && cur.ConcurrencyKey != "" {
		// A keyed job takes a slot of its key in the same EXEC, or waits
		// for one; failed for good, it gives back the slot its last lease
		// held.
		e := b.entry(c.shard, cur)
		switch {
		case took && !b.take(e, next):
			q.blocked(plan, ip, b, e, c, key, cur, now)
			return nil, false
		case !took:
			b.unlist(e, cur.ID)
			b.release(e, cur.ID, cur.LeaseToken)
		}
	}
	switch {
	case next != nil:
		q.move(ip, c.shard, c.id, cur, next, c.index)
		plan.writes = append(plan.writes, q.write(key, next))
		if took {
			return next, false
		}
	case cur == nil:
		// A hint with no value: the job was deleted outside jobkey, or
		// evicted. The hint goes, and the loss is counted (Stats.Vanished)
		// in the same EXEC, so a lost reply cannot hide it. The ZREM and
		// the ZADD NX are commands of their own, whose replies say whether
		// the hint was still there and whether this claim counted the
		// loss (vanishedFound): a hint someone else removed first (Delete)
		// takes back the count this claim made.
		vanished := q.ks.index(c.shard, seenVanished)
		ip.use(vanished) // its type is checked before MULTI
		ip.extra = append(ip.extra, []any{"zrem", q.ks.index(c.shard, c.index), c.id},
			[]any{"zadd", vanished, "NX", toMillis(now), c.id})
		return nil, true
	case derive(cur).index != c.index:
		// Not claimable, and the hint that led here disagrees with the value.
		q.move(ip, c.shard, c.id, cur, cur, c.index)
	default:
		// Same index, but the hint said due: its score may be stale.
		q.fixScore(ip, c.shard, c.id, q.entryOf(cur), now)
	}
	return nil, false
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

// confirmClaims deals with claims that committed on the master and that
// fewer than Config.MinReplicas replicas confirmed (unconfirmed): a
// failover could lose them and make their jobs pending again, for another
// worker to run beside the caller. So no such claim is handed over: each
// is renewed (Extend, fenced on its token) until a renewal is confirmed,
// which proves the replicas hold the job leased to this claim, and then
// replaces it in jobs. One that cannot be confirmed while its lease,
// measured from asked less a fifth of it, still holds is given back
// unrun, and its place in jobs set to nil.
func (q *Queue) confirmClaims(ctx context.Context, jobs []*Job, asked time.Time, unconfirmed error) {
	var all sync.WaitGroup
	for i, j := range jobs {
		if j != nil {
			all.Go(func() { jobs[i] = q.confirmClaim(ctx, j, asked, unconfirmed) })
		}
	}
	all.Wait()
}

// confirmClaim renews j until a renewal is confirmed, and returns it; or
// nil once j's lease may be ending, its claim lost, or ctx done. A claim
// it does not return is given back before it returns.
func (q *Queue) confirmClaim(ctx context.Context, j *Job, asked time.Time, err error) *Job {
	deadline := asked.Add(leaseLeft(j) - q.cfg.Lease/5)
	delay := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			// Given back before returning, not on a goroutine of its own: the
			// caller (a Work slot, a flush Work waits for) may be shutting
			// down, and nothing it started may outlive it.
			q.cfg.Logger.Warn("jobkey: claim not confirmed by replicas before its lease could end; given back unrun",
				"queue", q.name, "job", j.ID, "err", err)
			if rerr := q.releaseUnrun(ctx, j, asked.Add(leaseLeft(j))); rerr != nil && !claimGone(rerr) {
				q.cfg.Logger.Warn("jobkey: could not give back an unconfirmed claim; it is claimed again when its lease ends",
					"queue", q.name, "job", j.ID, "err", rerr)
			}
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, left)
		var ext *Job
		ext, err = q.Extend(cctx, j)
		cancel()
		switch {
		case err == nil:
			return ext
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
			return nil // the claim was lost (a failover), or its job moved on
		case final(err):
			deadline = time.Now() // no renewal can be confirmed (an ACL without +wait)
			continue
		}
		if sleepCtx(ctx, min(delay, max(time.Until(deadline), 0))) != nil {
			continue // reported and given back above
		}
		delay = min(2*delay, q.cfg.Lease/10)
	}
}
