package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jobkey/jobkey/internal/cas"
)

// MaxErrorLen bounds the LastError stored in a job, so failures cannot grow
// the value without limit.
const MaxErrorLen = 4 << 10

// transition is what a fenced write does to the stored job: next is a copy
// of it to edit, j the caller's copy, now Redis's clock.
type transition func(j, next *Job, now time.Time) *Job

// fenced runs a transition that only the lease holder may make. It writes
// only while the stored job is active under the lease token of the
// caller's copy j (fencing): a worker whose lease expired and whose job was
// claimed again, canceled or finished gets ErrLeaseLost and writes nothing.
// done, when not nil, recognises a stored job in which this very
// transition already landed (a retry after a lost reply) and returns it
// without writing.
func (q *Queue) fenced(ctx context.Context, j *Job, predict []string, done func(j, cur *Job) bool, fn transition) (*Job, error) {
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	out, errs := q.fencedMany(ctx, []*Job{j}, predict, done, func(int) transition { return fn }, nil)
	return out[0], errs[0]
}

// fencedMany is fenced for a batch, one compare-and-set per set of
// txnSets. Each job is fenced on its own, and errs[i] is jobs[i]'s own
// outcome: a lost lease, a job repeated earlier in the batch, or the
// failure of the transaction that carried it. fn(i) is job i's transition;
// gone(i), when not nil, says that the caller of job i gave up.
func (q *Queue) fencedMany(ctx context.Context, jobs []*Job, predict []string, done func(j, cur *Job) bool,
	fn func(i int) transition, gone func(i int) bool) (out []*Job, errs []error) {
	out, errs = make([]*Job, len(jobs)), make([]error, len(jobs))
	seen := make(map[string]int, len(jobs))
	var todo []int
	for i, j := range jobs {
		if err := q.checkJob(j); err != nil {
			errs[i] = err
			continue
		}
		if f, ok := seen[j.ID]; ok {
			errs[i] = fmt.Errorf("%w: job %q appears twice in one batch (first at %d); nothing was written for this entry", ErrInvalid, j.ID, f)
			continue
		}
		seen[j.ID] = i
		todo = append(todo, i)
	}
	q.eachTxn(ctx, false, todo, func(i int) string { return jobs[i].ID },
		func(set []int) error { return q.fencedTxn(ctx, jobs, set, predict, done, fn, gone, out, errs) },
		func(set []int, err error) {
			unconfirmed := errors.Is(err, ErrNotReplicated)
			for _, i := range set {
				// A job the transaction refused (its lease lost) keeps its
				// own error: nothing was written for it to confirm.
				if errs[i] != errLeftOut && (errs[i] == nil || !unconfirmed) {
					out[i], errs[i] = nil, err
				}
			}
		})
	return out, errs
}

func (q *Queue) fencedTxn(ctx context.Context, jobs []*Job, set []int, predict []string, done func(j, cur *Job) bool,
	fn func(int) transition, gone func(int) bool, out []*Job, errs []error) error {
	ids := make([]string, len(set))
	for k, i := range set {
		ids[k] = jobs[i].ID
	}
	keys, shards, checks := q.txnKeys(ids, predict...)
	mine := make([]*Job, len(set))
	for k, i := range set {
		mine[k] = jobs[i]
	}
	checks = q.pullChecks(checks, mine, shards, predict)
	aux := append(q.slotPredict(mine, shards), q.batchPredict(mine, predict)...)
	_, _, err := q.run(ctx, &casTxn{keys: keys, checks: checks, aux: aux, follow: q.slotFollow(shards),
		decide: func(r *casRead) (*casPlan, error) {
			plan := &casPlan{}
			var ip indexPlan
			b := q.newSlotBook(r)
			for k, i := range set {
				out[i], errs[i] = nil, nil
				if gone != nil && gone(i) {
					errs[i] = errLeftOut
					continue
				}
				f := fencedWrite{key: keys[k], shard: shards[k], j: jobs[i], done: done, fn: fn(i)}
				out[i], errs[i] = q.decideFenced(plan, &ip, b, f, r.jobs[k], r.errs[k], r.now)
			}
			b.finish(plan, &ip)
			plan.index(&ip)
			return plan, nil
		}})
	return err
}

// pullChecks adds to checks the ready index of each keyed job of a write
// that ends its lease (one that predicts an index besides the leased one:
// Complete, Fail, Release; not Extend). Freeing the slot pulls the key's
// first waiting jobs forward with a ZADD in their ready index, most often
// this job's priority's: predicted, its type rides round trip 1 instead of
// costing a round trip of its own before EXEC.
func (q *Queue) pullChecks(checks []typeCheck, jobs []*Job, shards []int, predict []string) []typeCheck {
	if !slices.ContainsFunc(predict, func(p string) bool { return p != idxLeased }) {
		return checks
	}
	for k, j := range jobs {
		if j.ConcurrencyKey == "" {
			continue
		}
		if c := (typeCheck{Key: q.ks.index(shards[k], readyIndex(j.Priority)), Want: "zset"}); !slices.Contains(checks, c) {
			checks = append(checks, c)
		}
	}
	return checks
}

// fencedWrite is one fenced transition inside a transaction: the caller's
// copy j, stored at key in shard.
type fencedWrite struct {
	key   string
	shard int
	j     *Job
	done  func(j, cur *Job) bool
	fn    transition
}

// decideFenced decides one fenced transition on the stored job cur (or
// the error reading it gave) and adds its writes to plan and ip.
func (d *decider) decideFenced(plan *casPlan, ip *indexPlan, b *slotBook, f fencedWrite, cur *Job, readErr error, now time.Time) (*Job, error) {
	j := f.j
	switch {
	case readErr != nil:
		return nil, readErr
	case cur == nil:
		return nil, fmt.Errorf("%w: %q in queue %q", ErrNotFound, j.ID, d.name)
	case f.done != nil && f.done(j, cur):
		plan.confirm = true // answered from a write of its own: waited for as if just made
		return cur, nil
	case cur.State != StateActive || cur.LeaseToken != j.LeaseToken:
		return nil, &LeaseLostError{ID: j.ID, Attempt: j.Attempt, Owner: j.LeaseOwner, Token: j.LeaseToken, Now: cur}
	}
	next := f.fn(j, cloneJob(cur), now)
	next.UpdatedAt = now
	if err := d.fits(next, cur); err != nil {
		return nil, err
	}
	if e := b.entry(f.shard, cur); e != nil {
		// A keyed job's lease lives in its key's value too: renewed there,
		// or given back, in the same EXEC.
		if next.State != StateActive {
			b.release(e, cur.ID, cur.LeaseToken)
		} else if !b.extend(e, cur, next) {
			// Its lease ran out, and its slot went to another job: the key
			// is full without it.
			return nil, &LeaseLostError{ID: j.ID, Attempt: j.Attempt, Owner: j.LeaseOwner, Token: j.LeaseToken, Now: cur}
		}
	}
	d.move(ip, f.shard, j.ID, cur, next, "")
	plan.writes = append(plan.writes, d.write(f.key, next))
	return next, nil
}

// checkJob refuses a job copy that cannot be this queue's.
func (q *Queue) checkJob(j *Job) error {
	if j == nil {
		return fmt.Errorf("%w: nil job", ErrInvalid)
	}
	if j.Queue != "" && j.Queue != q.name {
		return fmt.Errorf("%w: job %q belongs to queue %q, not %q", ErrInvalid, j.ID, j.Queue, q.name)
	}
	if err := validProgress(j); err != nil {
		return err
	}
	// Its ConcurrencyKey is not judged: the stored job's key is the one that
	// counts (a stored value may hold a key Enqueue refuses), and the
	// copy's only predicts which key value to read.
	return validID(j.ID)
}

// Extend renews the lease of a claimed job to Config.Lease from now, by
// Redis's clock. It writes the copy's Progress too, as Complete, Fail and
// Release do: a caller of Claim reports progress by setting it on its copy
// (Work's handlers call SetProgress).
func (q *Queue) Extend(ctx context.Context, j *Job) (*Job, error) {
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	if q.extends != nil {
		return q.extends.Do(ctx, j)
	}
	return q.fenced(ctx, j, []string{idxLeased}, nil, q.extend)
}

func (q *Queue) extend(j, next *Job, now time.Time) *Job {
	next.LeaseUntil = now.Add(q.cfg.Lease)
	next.Progress = j.Progress
	return next
}

func (q *Queue) flushExtends(ctx context.Context, batch []*cas.Call[*Job, *Job]) {
	flushFenced(ctx, q, batch, func(c *cas.Call[*Job, *Job]) *Job { return c.In() }, []string{idxLeased}, nil,
		func(*cas.Call[*Job, *Job]) transition { return q.extend })
}

// completeIn is one Complete call waiting in its group.
type completeIn struct {
	job    *Job
	result []byte
}

func (q *Queue) flushCompletes(ctx context.Context, batch []*cas.Call[completeIn, *Job]) {
	flushFenced(ctx, q, batch, func(c *cas.Call[completeIn, *Job]) *Job { return c.In().job },
		[]string{idxLeased, idxSucceeded}, completed,
		func(c *cas.Call[completeIn, *Job]) transition { return succeed(c.In().result) })
}

func succeed(result []byte) transition {
	return func(j, next *Job, now time.Time) *Job {
		recordRun(next, next, now, OutcomeSucceeded, "") // read before next changes: no copy needed
		next.Progress = j.Progress
		next.State = StateSucceeded
		next.Result = result
		next.LeaseUntil = now // the run is over; so is its lease
		return next
	}
}

// flushFenced runs a group-commit batch of one fenced transition as one
// fencedMany. A job that appears twice waits for a batch of its own, and a
// call whose transaction was refused whole is tried again alone, so each
// caller gets its own outcome.
func flushFenced[T any](ctx context.Context, q *Queue, batch []*cas.Call[T, *Job], job func(*cas.Call[T, *Job]) *Job,
	predict []string, done func(j, cur *Job) bool, fn func(*cas.Call[T, *Job]) transition) {
	batch = cas.Live(batch)
	for len(batch) > 0 {
		var now, later []*cas.Call[T, *Job]
		seen := map[string]bool{}
		for _, c := range batch {
			if id := job(c).ID; seen[id] {
				later = append(later, c)
			} else {
				seen[id] = true
				now = append(now, c)
			}
		}
		jobs := make([]*Job, len(now))
		for i, c := range now {
			jobs[i] = job(c)
		}
		out, errs := q.fencedMany(ctx, jobs, predict, done,
			func(i int) transition { return fn(now[i]) }, func(i int) bool { return now[i].Gone() })
		for i, c := range now {
			if len(now) > 1 && refusedWhole(errs[i]) {
				o, e := q.fencedMany(ctx, []*Job{job(c)}, predict, done,
					func(int) transition { return fn(c) }, func(int) bool { return c.Gone() })
				c.Finish(o[0], e[0])
				continue
			}
			c.Finish(out[i], errs[i])
		}
		batch = later
	}
}

// Complete finishes a claimed job with a result. Its key then expires after
// Config.Retention. Calling it again after a reply was lost returns the
// completed job and writes nothing.
func (q *Queue) Complete(ctx context.Context, j *Job, result []byte) (*Job, error) {
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	if err := q.resultFits(j, result); err != nil {
		return nil, err
	}
	if q.completes != nil {
		return q.completes.Do(ctx, completeIn{j, result})
	}
	return q.fenced(ctx, j, []string{idxLeased, idxSucceeded}, completed, succeed(result))
}

// completed recognises a job that j's own Complete already finished.
func completed(j, cur *Job) bool {
	return cur.State == StateSucceeded && cur.LeaseToken == j.LeaseToken
}

// CompleteMany completes a batch of claimed jobs, two round trips per
// transaction of at most Config.MaxBatch jobs (per shard on a cluster).
// results[i] is jobs[i]'s result; results may be nil.
//
// Each job is fenced on its own, so done[i] is jobs[i] as completed, or
// nil; when any job was not completed, err is a *BatchError whose Errs[i]
// says why for each: ErrLeaseLost, ErrNotFound, ErrCorrupt, a job repeated
// earlier in the batch, or the failure of the transaction that carried it.
// The other jobs complete regardless.
func (q *Queue) CompleteMany(ctx context.Context, jobs []*Job, results [][]byte) (done []*Job, err error) {
	if results != nil && len(results) != len(jobs) {
		return nil, fmt.Errorf("%w: CompleteMany with %d jobs and %d results", ErrInvalid, len(jobs), len(results))
	}
	for i, j := range jobs {
		if j != nil && results != nil {
			if err := q.resultFits(j, results[i]); err != nil {
				return nil, err
			}
		}
	}
	done, errs := q.fencedMany(ctx, jobs, []string{idxLeased, idxSucceeded}, completed, func(i int) transition {
		if results == nil {
			return succeed(nil)
		}
		return succeed(results[i])
	}, nil)
	return done, batchErr(errs)
}

// fits holds a transition's value to Config.MaxValueBytes: a transition
// that recorded a run drops the oldest History records first, then a
// LastError that would push it past is cut to what fits, and anything else that does
// (a result, a job an Update grew) refuses the transition for that job.
func (d *decider) fits(next, cur *Job) error {
	if len(next.History) != len(cur.History) || next.HistoryDropped != cur.HistoryDropped {
		d.historyFits(next) // a transition that recorded a run gives up the oldest records first
	}
	over := encodedSize(next) - d.cfg.MaxValueBytes
	if over > 0 && next.LastError != cur.LastError && over <= len(next.LastError) {
		next.LastError = truncate(next.LastError, len(next.LastError)-over) // a shorter string never has a longer header
		over = encodedSize(next) - d.cfg.MaxValueBytes
	}
	if over > 0 {
		return fmt.Errorf("%w: job %q would be %d bytes, limit %d", ErrTooLarge, next.ID, encodedSize(next), d.cfg.MaxValueBytes)
	}
	return nil
}

// resultFits refuses a result that would push the value past the limit.
func (q *Queue) resultFits(j *Job, result []byte) error {
	probe := *j
	probe.Result, probe.State, probe.LeaseUntil = result, StateSucceeded, q.clock.Guess()
	if n := encodedSize(&probe); n > q.cfg.MaxValueBytes {
		return fmt.Errorf("%w: job %q with its result would be %d bytes, limit %d", ErrTooLarge, j.ID, n, q.cfg.MaxValueBytes)
	}
	return nil
}

// Fail records a failed attempt of a claimed job. With attempts left the
// job goes back to pending, to run again after Config.Backoff; with none
// left, or when cause wraps ErrSkipRetry, it fails for good. cause becomes
// LastError (cut to MaxErrorLen). A cause made by RetryAfter sets the
// delay; one made by Snooze gives the attempt back instead (retry.go).
// The run is recorded in Job.History.
func (q *Queue) Fail(ctx context.Context, j *Job, cause error) (*Job, error) {
	return q.fail(ctx, j, cause, nil)
}

// fail is Fail under a retry policy (nil: Config.Backoff), decided in the
// outcome's one compare-and-set.
func (q *Queue) fail(ctx context.Context, j *Job, cause error, policy RetryPolicy) (*Job, error) {
	f := newFailure(cause, policy)
	return q.fenced(ctx, j, []string{idxLeased, readyIndex(j.Priority), idxFailed}, f.done, f.transition(&q.cfg))
}

// Release gives a claimed job back without spending its attempt: it is
// pending again and due at once. Work uses it on shutdown. The run is
// recorded in Job.History.
func (q *Queue) Release(ctx context.Context, j *Job) (*Job, error) {
	return q.release(ctx, j, 0)
}

// ReleaseAfter is Release with the job due d from now, by Redis's clock,
// rather than at once: a job given back because of something that passes
// (a rate limit, a dependency down) does not spin. d is 0..MaxRetryDelay.
func (q *Queue) ReleaseAfter(ctx context.Context, j *Job, d time.Duration) (*Job, error) {
	if d < 0 || d > MaxRetryDelay {
		return nil, fmt.Errorf("%w: ReleaseAfter delay %v, want 0..%v", ErrInvalid, d, MaxRetryDelay)
	}
	return q.release(ctx, j, d)
}

func (q *Queue) release(ctx context.Context, j *Job, d time.Duration) (*Job, error) {
	// A Release retried after its reply was lost finds the job pending
	// under this claim's token: released, and nobody claimed it since.
	done := func(j, cur *Job) bool { return cur.LeaseToken == j.LeaseToken && cur.State == StatePending }
	return q.fenced(ctx, j, []string{idxLeased, readyIndex(j.Priority)}, done, func(j, next *Job, now time.Time) *Job {
		cur := cloneJob(next)
		next.Progress = j.Progress
		next.State = StatePending
		next.Attempt = max(0, next.Attempt-1)
		next.RunAt = now.Add(d)
		next.LeaseUntil = now
		recordRun(next, cur, now, OutcomeReleased, "")
		return next
	})
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
