package jobkey

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Cancel cancels a pending or active job. The worker of an active job gets
// ErrLeaseLost on its next write, and Work cancels its handler's context.
// Canceling a canceled job returns it unchanged; a succeeded or failed job
// returns a *StateError.
func (q *Queue) Cancel(ctx context.Context, id string) (*Job, error) {
	return q.update(ctx, id, []string{idxReady, idxLeased, idxCanceled}, func(cur *Job, _ time.Time) (*Job, error) {
		switch cur.State {
		case StateCanceled:
			return nil, nil
		case StatePending, StateActive:
			cur.State = StateCanceled
			return cur, nil
		}
		return nil, &StateError{ID: id, Op: "cancel", State: cur.State}
	}, q.ks.cancelChannel())
}

// Retry puts a failed or canceled job back to pending, due now, with its
// attempts and snoozes counted from zero again. Its retention expiry is removed. A job
// canceled while it ran is due once that run's lease would have ended, so
// that a handler still stopping never runs beside the next one.
func (q *Queue) Retry(ctx context.Context, id string) (*Job, error) {
	return q.update(ctx, id, []string{idxReady, idxFailed, idxCanceled}, func(cur *Job, now time.Time) (*Job, error) {
		if cur.State != StateFailed && cur.State != StateCanceled {
			return nil, &StateError{ID: id, Op: "retry", State: cur.State}
		}
		cur.State = StatePending
		cur.Attempt, cur.Snoozes = 0, 0
		cur.RunAt = now // update holds it to the last run's lease (lastrun.go)
		return cur, nil
	}, q.ks.wakeChannel())
}

// Update edits a job by compare-and-set: fn gets the job as stored now and
// edits it in place; the edit is written only if nobody changed the job in
// between (otherwise fn runs again on the newer job). fn may change Type,
// Payload, RunAt, MaxAttempts, LastError, Result, Meta, Timeout, Priority,
// Retention and Deadline (any edit of a finished job keeps it for its
// retention, its own or the queue's, from the edit on); ConcurrencyKey
// never changes (its leases are counted under it), and the fields that say
// where the job stands are changed by Claim, Complete, Fail, Release, Cancel
// and Retry only. An error from fn is returned and nothing is written.
//
// A pending job whose last run may still be going on (one canceled while it
// ran, then retried) is not due before that run's lease ends: a RunAt fn
// sets earlier is moved to that moment, not refused, as Retry does, and
// the job returned shows the RunAt written. Its handler may still be
// stopping, and the job must not run beside it.
func (q *Queue) Update(ctx context.Context, id string, fn func(*Job) error) (*Job, error) {
	if fn == nil {
		return nil, fmt.Errorf("%w: Update with nil func", ErrInvalid)
	}
	return q.update(ctx, id, nil, func(cur *Job, _ time.Time) (*Job, error) {
		before := *cur
		if err := fn(cur); err != nil {
			return nil, err
		}
		if err := q.editable(&before, cur); err != nil {
			return nil, err
		}
		return cur, nil
	}, "")
}

func (q *Queue) editable(before, after *Job) error {
	fixed := []struct {
		name string
		same bool
	}{
		{"ID", before.ID == after.ID}, {"Queue", before.Queue == after.Queue}, {"State", before.State == after.State},
		{"Attempt", before.Attempt == after.Attempt}, {"LeaseOwner", before.LeaseOwner == after.LeaseOwner},
		{"LeaseUntil", before.LeaseUntil.Equal(after.LeaseUntil)}, {"CreatedAt", before.CreatedAt.Equal(after.CreatedAt)},
		{"Rev", before.Rev == after.Rev}, {"LeaseToken", before.LeaseToken == after.LeaseToken},
		// Set at enqueue, in its shard: a job's slot is counted in its key's
		// value by the claim that took it, and given back there.
		{"ConcurrencyKey", before.ConcurrencyKey == after.ConcurrencyKey},
		// Set at enqueue, in its batch's shard, and counted there.
		{"Batch", before.Batch == after.Batch},
		// A job's record of its runs, written by the runs' outcomes alone.
		{"Snoozes", before.Snoozes == after.Snoozes}, {"StartedAt", before.StartedAt.Equal(after.StartedAt)},
		{"History", slices.EqualFunc(before.History, after.History, sameRecord)}, {"HistoryDropped", before.HistoryDropped == after.HistoryDropped},
	}
	for _, f := range fixed {
		if !f.same {
			return fmt.Errorf("%w: Update may not change %s of job %q", ErrInvalid, f.name, before.ID)
		}
	}
	if after.Type == "" || len(after.Type) > MaxTypeLen {
		return fmt.Errorf("%w: Update: job type must be 1..%d bytes", ErrInvalid, MaxTypeLen)
	}
	if after.MaxAttempts < max(1, after.Attempt) || after.MaxAttempts > MaxAttemptsLimit {
		// Below Attempt, the job would have used more attempts than it may.
		return fmt.Errorf("%w: Update: MaxAttempts is %d, want %d..%d (at least the %d attempts made)",
			ErrInvalid, after.MaxAttempts, max(1, after.Attempt), MaxAttemptsLimit, after.Attempt)
	}
	if err := validMeta(after.Meta); err != nil {
		return err
	}
	if len(after.Progress) > MaxProgressBytes {
		return fmt.Errorf("%w: Update: Progress is %d bytes, limit %d", ErrInvalid, len(after.Progress), MaxProgressBytes)
	}
	t, err := validTimeout(after.Timeout)
	if err != nil {
		return err
	}
	after.Timeout = t
	if err := validPriority(after.Priority); err != nil {
		return err
	}
	if after.Retention, err = validRetention(after.Retention); err != nil {
		return err
	}
	if after.Deadline, err = validDeadline(after.Deadline); err != nil {
		return err
	}
	if !after.RunAt.IsZero() && !after.RunAt.Equal(before.RunAt) {
		if err := validTime("RunAt", after.RunAt); err != nil {
			return err
		}
	}
	if n := encodedSize(after); n > q.cfg.MaxValueBytes {
		return fmt.Errorf("%w: job %q would be %d bytes, limit %d", ErrTooLarge, after.ID, n, q.cfg.MaxValueBytes)
	}
	return nil
}

// Delete removes a pending or finished job: its value and its index entry
// go in one compare-and-set, two round trips. An active job is refused
// with a *StateError (errors.Is ErrState) naming its state, and stays as it
// is: cancel it first, or let it finish. So is a job canceled while it ran,
// in any state since (canceled, retried, canceled again), until that run's
// lease ends (StateError.Running): its handler may still be stopping, and a
// job enqueued again under its ID must not run beside it. A missing job is
// ErrNotFound. A value that cannot be read is never deleted: its read
// error is returned.
func (q *Queue) Delete(ctx context.Context, id string) error {
	return q.delete(ctx, id, 0)
}

// DeleteIn is Delete of a job that is in state s, and only then: a job in
// any other state is refused with a *StateError and left as it is, in the
// same compare-and-set. A tool that moves pending jobs elsewhere deletes
// them with DeleteIn(ctx, id, StatePending), so that a job a worker ran in
// between is never deleted as if it had been moved. A job in state s is
// still refused, as by Delete, while a run of it canceled earlier may go on
// (StateError.Running): a pending job retried after such a cancel, say.
func (q *Queue) DeleteIn(ctx context.Context, id string, s State) error {
	if !s.Valid() {
		return fmt.Errorf("%w: DeleteIn of a %s job", ErrInvalid, s)
	}
	return q.delete(ctx, id, s)
}

// delete is Delete, of a job in state want only when want is not 0.
func (q *Queue) delete(ctx context.Context, id string, want State) error {
	if err := validID(id); err != nil {
		return err
	}
	key, shard := q.ks.jobKeyOf(id)
	_, _, err := q.run(ctx, &casTxn{keys: []string{key},
		checks: q.checksFor(shard, idxReady, idxSucceeded, idxFailed, idxCanceled, idxCorrupt), follow: q.slotFollowListed([]int{shard}),
		decide: func(r *casRead) (*casPlan, error) {
			switch cur := r.jobs[0]; {
			case r.errs[0] != nil:
				return nil, r.errs[0]
			case cur == nil:
				return nil, fmt.Errorf("%w: %q in queue %q", ErrNotFound, id, q.name)
			case cur.State == StateActive, want != 0 && cur.State != want:
				return nil, &StateError{ID: id, Op: "delete", State: cur.State}
			case lastRunMayGoOn(cur, r.now):
				return nil, &StateError{ID: id, Op: "delete", State: cur.State, Running: cur.LeaseUntil}
			default:
				var ip indexPlan
				q.deleteJob(&ip, shard, key, cur)
				plan := &casPlan{}
				b := q.newSlotBook(r)
				b.unlistMoved(shard, cur, nil)
				b.finish(plan, &ip)
				plan.index(&ip)
				return plan, nil
			}
		}})
	return err
}

// deleteJob adds to ip the steps that remove cur, stored at key, and its
// index entry, and a stale entry in the corrupt index if there is one.
func (q *Queue) deleteJob(ip *indexPlan, shard int, key string, cur *Job) {
	q.move(ip, shard, cur.ID, cur, nil, "")
	ip.zrem(q.ks.index(shard, idxCorrupt), cur.ID)
	ip.extra = append(ip.extra, []any{"del", key})
}
