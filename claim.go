package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/readahead"
)

// candidate is a due entry read from an index: a hint, not a truth.
type candidate = readahead.Candidate

// leasedPrio ranks the expired leases of a shard: before every ready job,
// as the most overdue work; their index does not say their priority.
const leasedPrio = MaxPriority + 1

// pickBlock returns n candidates for a batch, the highest priorities first,
// and the rest. Within the top priority, when it has more than n, it takes
// a random contiguous block in index order: concurrent batches then overlap
// only when their blocks do, where random picks of n would nearly always
// share one job and abort each other's EXEC.
func pickBlock(cands []candidate, n int) (block, rest []candidate) {
	slices.SortStableFunc(cands, func(a, b candidate) int { return b.Prio - a.Prio })
	top := 0
	for top < len(cands) && cands[top].Prio == cands[0].Prio {
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
	return q.claims.Do(ctx, worker)
}

// workClaim is Claim for a Work runner. A claim whose call a flush has
// taken is waited for even once ctx has ended: the runner then gives back
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
	return q.claims.Await(ctx, worker)
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
		v, pooled, err := q.candidates(ctx, round, q.cfg.ClaimWindow, readahead.AnyShard)
		if err != nil {
			return nil, err
		}
		cands := v.Cands
		if len(cands) == 0 {
			break
		}
		if !pooled {
			readahead.ByPriority(cands) // the pool's order serves the shards in turn
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
				q.pool.Served(cands[:k+1])
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
func (q *Queue) flushClaims(ctx context.Context, batch []*cas.Call[string, *Job]) {
	batch = cas.Live(batch)
	switch len(batch) {
	case 0:
		return
	case 1:
		c := batch[0]
		c.Finish(q.claimAlone(ctx, c.In(), c.Gone))
		return
	}
	workers := make([]string, len(batch))
	for i, c := range batch {
		workers[i] = c.In()
	}
	got, err := q.claimBatch(ctx, workers, func(i int) bool { return batch[i].Gone() })
	for i, c := range batch {
		switch {
		case got[i] != nil:
			c.Finish(got[i], nil)
		case err != nil:
			c.Finish(nil, err)
		default:
			c.Finish(nil, ErrNoJob)
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
		mode := readahead.AnyShard
		if q.cluster() {
			mode = readahead.OneShard // one transaction stays in one hash slot
		}
		v, pooled, err := q.candidates(ctx, round, max(q.cfg.ClaimWindow, 8*len(waiting)), mode)
		if err != nil {
			return got, err
		}
		cands := v.Cands
		if q.cluster() && len(cands) > 0 {
			// One transaction stays in one hash slot: the shard of the highest
			// priority's candidate, or the pool's choice.
			if !pooled {
				readahead.ByPriority(cands)
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
		q.leftOver(v, slices.DeleteFunc(slices.Clone(v.Cands), func(c candidate) bool {
			return slices.ContainsFunc(block, func(b candidate) bool { return b.ID == c.ID })
		}), pooled)
		q.pool.Served(block)
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

func validOwner(worker string) error {
	if worker == "" || len(worker) > 256 {
		return fmt.Errorf("%w: worker name must be 1..256 bytes, got %d", ErrInvalid, len(worker))
	}
	return nil
}

// candidates returns due entries to try: in the first round of a process
// whose Work runs, those the pool holds (see duePool), taken by mode
// (readahead.AnyShard, readahead.OneShard), when it has some; else a read of the indexes, n
// entries per index, of every shard when the pool cannot vouch for some.
func (q *Queue) candidates(ctx context.Context, round, n, mode int) (_ dueView, pooled bool, _ error) {
	work := q.listeners.Load() > 0
	q.probeGone()
	if round == 0 && work {
		if cands := q.pool.Take(n, mode); len(cands) > 0 {
			return dueView{Cands: cands}, true, nil
		}
	}
	if work && !q.pool.Complete() {
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
		q.pool.PutBack(rest)
		return
	}
	v.Cands = rest
	q.pool.Fill(v)
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
		keys[i] = q.ks.jobKey(c.Shard, c.ID)
	}
	for _, k := range q.indexKeys(cands, idxLeased) {
		checks = append(checks, typeCheck{Key: k, Want: "zset"})
	}
	got = make([]*Job, len(cands))
	guards, guardOf := q.shardGuards(cands)
	shards := make([]int, len(cands))
	for i, c := range cands {
		shards[i] = c.Shard
	}
	var lost []candidate
	var plan *casPlan
	asked := time.Now() // the claims' leases are measured from here
	_, plan, err = q.run(ctx, &casTxn{keys: keys, checks: checks, noRetry: noRetry, guards: guards.keys, follow: q.slotFollow(shards),
		decide: func(r *casRead) (*casPlan, error) {
			clear(got)
			lost = lost[:0]
			plan := &casPlan{}
			var ip indexPlan
			b := q.newSlotBook(r)
			now := r.now
			for i, c := range cands {
				if gone != nil && gone(i) || r.guarded[guardOf[i]] {
					continue // the caller left, or the shard is paused
				}
				claimed, hintLost := q.decideCandidate(plan, &ip, b, c, keys[i], r.jobs[i], r.errs[i], workers[i], now)
				got[i] = claimed
				if hintLost {
					lost = append(lost, c)
				}
			}
			b.finish(plan, &ip)
			plan.index(&ip)
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
	q.settleLostHints(ctx, plan, lost)
	return got, !plan.empty(), nil
}

// settleLostHints deals with the candidates whose entry pointed at no value
// when the claim's compare-and-set read them: the EXEC removed each entry
// with a ZREM of its own and counted it in the log of lost hints (seenLost). A ZREM that
// removed nothing means someone else removed the entry first, as Delete
// does with the value: nothing was lost, and the count is taken back. One
// that removed it found an entry whose value is gone (deleted outside
// jobkey, or evicted): that is logged.
func (q *Queue) settleLostHints(ctx context.Context, plan *casPlan, cands []candidate) {
	if plan == nil {
		return
	}
	for _, c := range cands {
		lostLog := q.ks.index(c.Shard, seenLost)
		if stepReply(plan, "zrem", q.ks.index(c.Shard, c.Index), c.ID) != 0 {
			q.cfg.Logger.Error("jobkey: a job's index entry pointed at no value: the job was deleted outside jobkey, or evicted by Redis (is maxmemory-policy noeviction?)",
				"queue", q.name, "job", c.ID)
			continue
		}
		// Someone removed the hint first, as Delete does with the value:
		// nothing was lost. The count goes again if this claim made it.
		if stepReply(plan, "zadd", lostLog, c.ID) == 1 {
			if err := q.rdb.ZRem(ctx, lostLog, c.ID).Err(); err != nil {
				q.cfg.Logger.Warn("jobkey: could not take back the count of a lost hint", "queue", q.name, "job", c.ID, "err", err)
			}
		}
	}
}

// stepReply returns the integer reply of the plan's step name on key whose
// last argument is member, once EXEC answered: -1 when there is none.
func stepReply(plan *casPlan, name, key, member string) int64 {
	for i := range plan.results {
		r := &plan.results[i]
		a := r.Args
		if r.Cmd() != name || len(a) < 3 || a[1] != key || a[len(a)-1] != member {
			continue
		}
		if n, ok := r.Val.(int64); ok && r.Err == nil {
			return n
		}
	}
	return -1
}

// decideCandidate decides what a claim does about one candidate, stored at
// key, whose value read as cur (or gave readErr): claim it for worker (the
// job returned), fail it for good, put its hint right, set an unreadable
// value aside, or skip a newer format. Its writes go to plan and ip; lost
// says the hint pointed at no value.
func (d *decider) decideCandidate(plan *casPlan, ip *indexPlan, b *slotBook, c candidate, key string, cur *Job, readErr error,
	worker string, now time.Time) (claimed *Job, lost bool) {
	switch {
	case errors.Is(readErr, ErrUnsupportedFormat):
		// Written by a newer jobkey: neither ours to read nor to set aside.
		// Its hint stays for the workers that can read it; this one skips
		// it for a while (casPlan.newerFormat), and logs the sighting so Stats
		// shows a rollout that stalls.
		plan.newerFormat = append(plan.newerFormat, c.ID)
		ip.zadd(d.ks.index(c.Shard, seenNewerFormat), toMillis(now), c.ID)
		return nil, false
	case readErr != nil:
		// The value cannot be read. Its bytes are kept untouched; its hint
		// moves to the corrupt index, so no claimer trips on it again and
		// Stats counts it.
		ip.zrem(d.ks.index(c.Shard, c.Index), c.ID)
		ip.zadd(d.ks.index(c.Shard, idxCorrupt), toMillis(now), c.ID)
		return nil, false
	}
	next, took := d.decideClaim(cur, worker, now)
	if next != nil && cur.ConcurrencyKey != "" {
		// A keyed job takes a slot of its key in the same EXEC, or waits
		// for one; failed for good, it gives back the slot its last lease
		// held.
		e := b.entry(c.Shard, cur)
		switch {
		case took && !b.take(e, next):
			d.blocked(plan, ip, b, e, c, key, cur, now)
			return nil, false
		case !took:
			b.unlist(e, cur.ID)
			b.release(e, cur.ID, cur.LeaseToken)
		}
	}
	switch {
	case next != nil:
		d.move(ip, c.Shard, c.ID, cur, next, c.Index)
		plan.writes = append(plan.writes, d.write(key, next))
		if took {
			return next, false
		}
	case cur == nil:
		// A hint with no value: the job was deleted outside jobkey, or
		// evicted. The hint goes, and the loss is counted (Stats.Vanished)
		// in the same EXEC, so a lost reply cannot hide it. The ZREM and
		// the ZADD NX are commands of their own, whose replies say whether
		// the hint was still there and whether this claim counted the
		// loss (settleLostHints): a hint someone else removed first (Delete)
		// takes back the count this claim made.
		lostLog := d.ks.index(c.Shard, seenLost)
		ip.use(lostLog) // its type is checked before MULTI
		ip.extra = append(ip.extra, []any{"zrem", d.ks.index(c.Shard, c.Index), c.ID},
			[]any{"zadd", lostLog, "NX", toMillis(now), c.ID})
		return nil, true
	case derive(cur).index != c.Index:
		// Not claimable, and the hint that led here disagrees with the value.
		d.move(ip, c.Shard, c.ID, cur, cur, c.Index)
	default:
		// Same index, but the hint said due: its score may be stale.
		d.fixScore(ip, c.Shard, c.ID, d.entryOf(cur), now)
	}
	return nil, false
}

// decideClaim says what a claim does to cur at now (Redis's clock): take it
// (a pending job that is due, or an active one whose lease expired, with
// attempts left), fail it (no attempt left), or nothing (nil).
func (d *decider) decideClaim(cur *Job, worker string, now time.Time) (next *Job, took bool) {
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
			recordRun(next, cur, cur.LeaseUntil, OutcomeLost, next.LastError)
			d.historyFits(next)
		} else {
			// Pending with no attempt left: MaxAttempts was lowered below it.
			next.LastError = fmt.Sprintf("no attempt left: %d of %d made", cur.Attempt, cur.MaxAttempts)
		}
		next.UpdatedAt = now
		return next, false
	case due || expired:
		return d.claimed(cur, worker, now), true
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
		if c.Shard == cands[0].Shard {
			out = append(out, c)
		}
	}
	return out
}

// claimed returns cur taken by worker: active, one more attempt, leased
// under a token of its own. A run whose lease ran out unrecorded is kept in
// History, as lasting until its lease's end.
func (d *decider) claimed(cur *Job, worker string, now time.Time) *Job {
	next := cloneJob(cur)
	if cur.State == StateActive {
		recordRun(next, cur, cur.LeaseUntil, OutcomeLost, "its lease ran out before its outcome was recorded")
		d.historyFits(next)
	}
	next.StartedAt = now
	next.State = StateActive
	next.Attempt++
	next.LeaseOwner = worker
	next.LeaseUntil = now.Add(d.cfg.Lease)
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
func (d *decider) fixScore(p *indexPlan, shard int, id string, want entry, now time.Time) {
	if want.score > toMillis(now) {
		p.zadd(d.ks.index(shard, want.index), want.score, id)
	}
}
