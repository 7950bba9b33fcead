package jobkey

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// BulkResult counts what a bulk action did.
type BulkResult struct {
	// Done counts the jobs the action changed.
	Done int
	// Skipped counts the jobs listed for the action that had changed state
	// (or type) by the time their compare-and-set read them: they are left
	// as they are, not forced.
	Skipped int
	// Unreadable counts the listed jobs whose value cannot be read; they
	// are left as they are (see ListOpts.Corrupt and Verify).
	Unreadable int
	// Unconfirmed counts the jobs of Done that were changed on the master
	// only: with Config.MinReplicas, the transaction that changed them was
	// not confirmed by the replicas in time (the error is then a *BulkError
	// that matches ErrNotReplicated), so a failover may still undo it. The
	// action stops at that transaction: the other jobs of Done were
	// confirmed, and the rest was not done.
	Unconfirmed int
}

// RetryFailed puts every failed job of type typ ("": every type) back to
// pending, due now, as Retry does, and wakes the workers. Each job is its
// own compare-and-set, batched by shard, decided from its value as stored
// when the batch runs, so a job that changed state in between is skipped.
// It is safe to run while workers run.
func (q *Queue) RetryFailed(ctx context.Context, typ string) (BulkResult, error) {
	return q.bulk(ctx, "retry", ListOpts{State: StateFailed, Type: typ}, retried, q.ks.wakeChannel())
}

// DeleteFinished deletes every job in the finished state s (succeeded,
// failed or canceled) of type typ ("": every type), as Delete does, each
// job its own compare-and-set, batched by shard.
func (q *Queue) DeleteFinished(ctx context.Context, s State, typ string) (BulkResult, error) {
	if !s.Finished() {
		return BulkResult{}, fmt.Errorf("%w: DeleteFinished of %s jobs: want succeeded, failed or canceled", ErrInvalid, s)
	}
	return q.bulk(ctx, "delete", ListOpts{State: s, Type: typ}, nil, "")
}

// CancelPending cancels every pending job of type typ ("": every type),
// each job its own compare-and-set, batched by shard. A job claimed in
// between is skipped: cancel it with Cancel.
func (q *Queue) CancelPending(ctx context.Context, typ string) (BulkResult, error) {
	return q.bulk(ctx, "cancel", ListOpts{State: StatePending, Type: typ}, canceled, "")
}

// retried is Retry's transition.
func retried(cur *Job, now time.Time) *Job {
	next := cloneJob(cur)
	next.State = StatePending
	next.Attempt, next.Snoozes = 0, 0
	next.RunAt = dueAfterLastRun(cur, now)
	return next
}

// canceled is Cancel's transition of a pending job.
func canceled(cur *Job, _ time.Time) *Job {
	next := cloneJob(cur)
	next.State = StateCanceled
	return next
}

// bulk applies to every job that List o finds a transition (nil: delete
// the job), page by page, one compare-and-set per shard and MaxBatch jobs
// of a page. notify, when set, is published once per transaction that
// changed a job.
//
// Pending jobs are walked newest RunAt first: jobs enqueued while the walk
// goes on are due now, behind the walk once it passed now, so a walk ends
// however fast producers enqueue. Finished jobs are walked newest first
// for the same reason. Shards that cannot be read are left out, and a
// *ShardsError names them once the others are done. Every error is a
// *BulkError that counts what was done.
func (q *Queue) bulk(ctx context.Context, op string, o ListOpts, to func(*Job, time.Time) *Job, notify string) (BulkResult, error) {
	res, err := q.bulkAll(ctx, op, o, to, notify)
	if err != nil {
		return res, &BulkError{Op: op, Result: res, Err: err}
	}
	return res, nil
}

// bulkAll is bulk, whose errors it wraps.
func (q *Queue) bulkAll(ctx context.Context, op string, o ListOpts, to func(*Job, time.Time) *Job, notify string) (BulkResult, error) {
	var start time.Time
	if o.State == StatePending {
		var err error
		if start, err = q.clock.Now(ctx, q.rdb); err != nil {
			return BulkResult{}, err
		}
	}
	res, missing := q.bulkWalk(ctx, o, to, notify, nil)
	var se *ShardsError
	if missing != nil && !errors.As(missing, &se) || o.State != StatePending {
		return res, missing
	}
	// A claim that finds a keyed job's key full moves the job's entry to
	// when the key's first lease would end (concurrencykey.go): past the
	// walk, which goes newest first, when that happens behind it. So the
	// listing is walked once more, whole, for the keyed jobs that were
	// pending, and due, when the walk started; jobs enqueued since are left
	// alone, as the walk leaves them. Whole, not just above the walk's
	// start: the lease that parks a job is the claimer's, whose process may
	// run with a longer Config.Lease than this one, a key whose value
	// cannot be read parks its jobs a minute ahead, and a write that frees
	// the slot moves a parked job's entry back to its RunAt, below the
	// start, maybe before this walk reaches it. A job moved during this
	// pass too is tried by another, up to three.
	for range 3 {
		more, err := q.bulkWalk(ctx, o, to, notify, func(j *Job) bool {
			return j.ConcurrencyKey != "" && !j.RunAt.After(start) && !j.CreatedAt.After(start)
		})
		// The unreadable entries it lists were counted by the first walk:
		// they are not counted again.
		res.Done += more.Done
		res.Skipped += more.Skipped
		res.Unconfirmed += more.Unconfirmed
		switch {
		case err != nil && !errors.As(err, &se):
			return res, err
		case err != nil:
			missing = unionShards(missing, err)
		}
		if more.Done == 0 {
			break
		}
	}
	return res, missing
}

// unionShards returns the *ShardsError that names the shards of both: prev
// (nil or a *ShardsError) and next, which a later walk left out.
func unionShards(prev, next error) error {
	var a, b *ShardsError
	switch {
	case !errors.As(prev, &a):
		return next
	case !errors.As(next, &b):
		return prev
	}
	why := map[int]error{}
	for _, e := range []*ShardsError{b, a} { // a's reason wins
		for i, s := range e.Shards {
			why[s] = e.Errs[i]
		}
	}
	out := &ShardsError{Of: a.Of}
	for _, s := range slices.Sorted(maps.Keys(why)) {
		out.add(s, why[s])
	}
	return out
}

// bulkWalk is one walk of bulk over o's listing. When keep is set, it
// acts only on the jobs keep accepts.
func (q *Queue) bulkWalk(ctx context.Context, o ListOpts, to func(*Job, time.Time) *Job, notify string,
	keep func(j *Job) bool) (BulkResult, error) {
	var res BulkResult
	var missing error
	o.Limit = MaxListLimit
	for {
		page, err := q.list(ctx, o, o.State == StatePending)
		var se *ShardsError
		switch {
		case errors.As(err, &se):
			missing = err
		case err != nil:
			return res, err
		}
		res.Unreadable += len(page.Unreadable)
		byShard := map[int][]string{}
		for _, j := range page.Jobs {
			if keep != nil && !keep(j) {
				continue
			}
			s := q.ks.shardOf(j.ID)
			byShard[s] = append(byShard[s], j.ID)
		}
		for s, ids := range byShard {
			for chunk := range slices.Chunk(ids, q.cfg.MaxBatch) {
				done, skipped, unconfirmed, err := q.bulkChunk(ctx, s, chunk, o, to, notify)
				res.Done += done
				res.Skipped += skipped
				res.Unconfirmed += unconfirmed
				if err != nil {
					return res, err
				}
			}
		}
		if q.afterBulkPage != nil {
			q.afterBulkPage()
		}
		if page.Next == "" {
			return res, missing
		}
		o.Cursor = page.Next
	}
}

// bulkChunk runs bulkTxn on ids, then one job at a time if the batch kept
// conflicting with others' writes, so one busy job does not hold back the
// rest. unconfirmed counts the jobs of done that its last transaction
// changed on the master only (ErrNotReplicated), where it stopped.
func (q *Queue) bulkChunk(ctx context.Context, s int, ids []string, o ListOpts, to func(*Job, time.Time) *Job, notify string) (done, skipped, unconfirmed int, err error) {
	done, skipped, err = q.bulkTxn(ctx, s, ids, o, to, notify)
	if !errors.Is(err, ErrConflict) || len(ids) == 1 {
		return done, skipped, masterOnly(done, err), err
	}
	done, skipped = 0, 0
	for _, id := range ids {
		d, sk, err := q.bulkTxn(ctx, s, []string{id}, o, to, notify)
		done, skipped = done+d, skipped+sk
		if err != nil {
			return done, skipped, masterOnly(d, err), err
		}
	}
	return done, skipped, 0, nil
}

// masterOnly is how many of the done jobs of a transaction that ended in
// err are on the master only: all of them when err is ErrNotReplicated.
func masterOnly(done int, err error) int {
	if errors.Is(err, ErrNotReplicated) {
		return done
	}
	return 0
}

// bulkTxn applies a bulk transition to the jobs ids of one shard in one
// compare-and-set, each decided from its own value: a job no longer in
// o.State, or of another type, is skipped.
func (q *Queue) bulkTxn(ctx context.Context, shard int, ids []string, o ListOpts, to func(*Job, time.Time) *Job, notify string) (done, skipped int, err error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = q.ks.jobKey(shard, id)
	}
	from := derive(&Job{State: o.State}).index
	predict := []string{from}
	if to != nil {
		predict = append(predict, derive(to(&Job{State: o.State}, time.Time{})).index)
	}
	_, _, err = q.run(ctx, &casTxn{keys: keys, checks: q.checksFor(shard, predict...), follow: q.slotFollowListed(slices.Repeat([]int{shard}, len(keys))),
		decide: func(r *casRead) (*casPlan, error) {
			done, skipped = 0, 0
			top := 0 // the highest priority made pending, for the wake-up hint
			plan := &casPlan{}
			var ip indexPlan
			b := q.newSlotBook(r)
			for i, cur := range r.jobs {
				if r.errs[i] != nil || cur == nil || cur.State != o.State || o.Type != "" && cur.Type != o.Type ||
					to == nil && lastRunMayGoOn(cur, r.now) {
					skipped++
					continue
				}
				done++
				if to == nil {
					q.deleteJob(&ip, shard, keys[i], cur)
					b.unlistMoved(shard, cur, nil)
					continue
				}
				next := to(cur, r.now)
				next.UpdatedAt = r.now
				if next.State == StatePending {
					top = max(top, next.Priority)
				}
				q.move(&ip, shard, cur.ID, cur, next, "")
				b.unlistMoved(shard, cur, next)
				plan.writes = append(plan.writes, q.write(keys[i], next))
			}
			b.finish(plan, &ip)
			if notify != "" && done > 0 {
				ip.extra = append(ip.extra, []any{"publish", notify, wakeHint(top)})
			}
			plan.index(&ip)
			return plan, nil
		}})
	if err != nil && !errors.Is(err, ErrNotReplicated) {
		return 0, 0, err
	}
	return done, skipped, err // done counts jobs a *ReplicationError's EXEC applied
}

// BulkError is the error of a bulk action (RetryFailed, DeleteFinished,
// CancelPending) that did not act on every job it was asked to: Result
// counts what it did all the same, as the BulkResult returned beside it
// does, and Err says why the rest was not done. When Err is a
// *ShardsError, the action went through every shard it could read and
// left the jobs of the others as they are; otherwise it stopped at Err.
// errors.Is and errors.As see Err.
type BulkError struct {
	Op     string     // the action: "retry", "delete" or "cancel"
	Result BulkResult // what it did
	Err    error      // why it did not do the rest
}

func (e *BulkError) Error() string {
	r := e.Result
	unconfirmed := ""
	if r.Unconfirmed > 0 {
		unconfirmed = fmt.Sprintf(" (%d of them applied on the master only, not confirmed by the replicas)", r.Unconfirmed)
	}
	done := fmt.Sprintf("jobkey: %s: %d done%s, %d skipped, %d unreadable", e.Op, r.Done, unconfirmed, r.Skipped, r.Unreadable)
	why := strings.TrimPrefix(e.Err.Error(), "jobkey: ") // "jobkey: " once
	var se *ShardsError
	if errors.As(e.Err, &se) {
		return fmt.Sprintf("%s in the shards it could read; the jobs of the others were left as they are: %s", done, why)
	}
	return fmt.Sprintf("%s before it stopped; the rest was not done: %s", done, why)
}

// Unwrap returns Err, for errors.Is and errors.As.
func (e *BulkError) Unwrap() error { return e.Err }
