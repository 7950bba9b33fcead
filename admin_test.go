package jobkey

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	p, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "p"})
	require.NoError(t, err)
	c, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, c.State)
	f.requireIndexed(t, c)
	again, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, c.Rev, again.Rev, "canceling twice writes nothing")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	ca, err := f.q.Cancel(f.ctx, a.ID)
	require.NoError(t, err)
	f.requireIndexed(t, ca)
	_, err = f.q.Complete(f.ctx, a, nil)
	require.ErrorIs(t, err, ErrLeaseLost, "the canceled job's worker is fenced off")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "s"})
	require.NoError(t, err)
	s, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, s, nil)
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, "s")
	var se *StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, StateSucceeded, se.State)
	_, err = f.q.Retry(f.ctx, "s")
	require.ErrorAs(t, err, &se)
	_, err = f.q.Cancel(f.ctx, "missing")
	require.ErrorIs(t, err, ErrNotFound)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 1, Canceled: 2}, st)
}

// A Cancel that finds the job canceled already answers from a write that
// may be its own, unconfirmed: with MinReplicas it waits for the replicas
// before it answers, so running it again after ErrNotReplicated never
// reports a cancel a failover could still undo.
func TestCancelOfCanceledJobWaitsForTheReplicas(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout})
	_, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	thaw := r.freeze(t)
	_, err = r.q.Cancel(r.ctx, "a")
	require.ErrorIs(t, err, ErrNotReplicated)
	_, err = r.q.Cancel(r.ctx, "a")
	require.ErrorIs(t, err, ErrNotReplicated, "canceled on the master only, still")
	thaw()
	r.sent.reset()
	j, err := untilReplicated(t, func() (*Job, error) { return r.q.Cancel(r.ctx, "a") })
	require.NoError(t, err)
	require.Equal(t, StateCanceled, j.State)
	require.Equal(t, StateCanceled, r.onReplica(t, "a").State)
	require.Contains(t, r.sent.all(), []string{"unwatch", "set", "wait"}, "it wrote before its WAIT")
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{Delay: time.Hour})
	require.NoError(t, err)
	u, err := f.q.Update(f.ctx, j.ID, func(cur *Job) error {
		cur.Payload = []byte("v2")
		cur.RunAt = f.clock.Now()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []byte("v2"), u.Payload)
	require.EqualValues(t, 2, u.Rev)
	f.requireIndexed(t, u)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "the new RunAt made it due")
	require.Equal(t, []byte("v2"), c.Payload)

	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.State = StateSucceeded; return nil })
	require.ErrorContains(t, err, "may not change State")
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { return errors.New("changed my mind") })
	require.EqualError(t, err, "changed my mind")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, c, got, "refused edits wrote nothing")
}

// A plan that writes an index nobody predicted pays one more round trip of
// TYPE checks under the WATCH; a wrong type found there refuses the write.
func TestLateTypeCheckRefusesBeforeWrite(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{ID: "late", Delay: time.Hour})
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.Del(f.ctx, keys.Ready).Err())
	require.NoError(t, f.rdb.Set(f.ctx, keys.Ready, "not a zset", 0).Err())
	before := f.rdb.Get(f.ctx, keys.Job).Val()

	f.hook.Reset()
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.RunAt = f.clock.Now(); return nil })
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, keys.Ready, wt.Key)
	require.EqualValues(t, 3, f.hook.RTT.Load(), "WATCH+GET, late TYPE, UNWATCH")
	require.Equal(t, before, f.rdb.Get(f.ctx, keys.Job).Val(), "the value is as it was")
	require.Equal(t, "not a zset", f.rdb.Get(f.ctx, keys.Ready).Val())
}

// Retry of a priority job from another process publishes the wake-up hint of
// its priority, as Enqueue of the same job does, so a Work elsewhere drops
// its read-ahead entries of lower priorities and claims the retried job, due
// at once, next. Here a priority-9 job is retried during run 1, and it is
// run 2.
func TestRetryOfPriorityJobIsClaimedBeforeReadAhead(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil
	admin := f.twin(t) // another process's Queue
	hi, err := admin.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "hi-retried", Priority: MaxPriority, MaxAttempts: 1})
	require.NoError(t, err)
	c, err := admin.Claim(f.ctx, "x")
	require.NoError(t, err)
	require.Equal(t, hi.ID, c.ID)
	_, err = admin.Fail(f.ctx, c, fmt.Errorf("boom"))
	require.NoError(t, err)
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	var log runLog
	startWork(t, f.q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			r, err := admin.Retry(ctx, hi.ID)
			if err != nil {
				return nil, err
			}
			if r.State != StatePending {
				return nil, fmt.Errorf("retry left %s", r.State)
			}
			time.Sleep(50 * time.Millisecond) // the hint arrives
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, hi.ID, got[1].ID, "run 2 must be the retried priority-9 job, got %s (priority %d)", got[1].ID, got[1].Priority)
}

// Update that makes a pending job due now at priority 9 (RunAt and Priority
// are both editable) from another process publishes the wake-up hint of that
// priority, so a Work elsewhere drops its read-ahead entries of lower
// priorities and claims the job next. Here the Update runs during run 1, and
// the job is run 2.
func TestUpdateRaisingPriorityIsClaimedBeforeReadAhead(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil
	admin := f.twin(t) // another process's Queue
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	later, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "later", Delay: time.Hour})
	require.NoError(t, err)
	var log runLog
	startWork(t, f.q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			_, err := admin.Update(ctx, later.ID, func(u *Job) error {
				u.Priority, u.RunAt = MaxPriority, time.Now().Add(-time.Second)
				return nil
			})
			if err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, later.ID, got[1].ID, "run 2 must be the job made due at priority 9, got %s (priority %d)", got[1].ID, got[1].Priority)
}

// A job's Retention and Deadline travel with it through every path that
// rewrites it: Update of other fields keeps them (and may change them),
// Fail, Retry and RetryFailed keep them, EnqueueMany and a periodic tick
// store them.
func TestRetentionAndDeadlineSurviveEveryRewrite(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	deadline := ms(f.clock.Now().Add(24 * time.Hour))
	opts := func(id string) *EnqueueOpts {
		return &EnqueueOpts{ID: id, Retention: 90 * time.Second, Deadline: deadline}
	}
	kept := func(step, id string, retention time.Duration, deadline time.Time) {
		t.Helper()
		got, err := f.q.Get(f.ctx, id)
		require.NoError(t, err, step)
		require.Equal(t, retention, got.Retention, step)
		require.Equal(t, deadline, got.Deadline, step)
	}
	_, err := f.q.Enqueue(f.ctx, "t", nil, opts("a"))
	require.NoError(t, err)
	_, err = f.q.Update(f.ctx, "a", func(j *Job) error { j.Payload = []byte("new"); return nil })
	require.NoError(t, err)
	kept("Update of the payload", "a", 90*time.Second, deadline)

	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, c, fmt.Errorf("no: %w", ErrSkipRetry))
	require.NoError(t, err)
	kept("Fail", "a", 90*time.Second, deadline)
	_, err = f.q.Retry(f.ctx, "a")
	require.NoError(t, err)
	kept("Retry", "a", 90*time.Second, deadline)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, c, fmt.Errorf("no: %w", ErrSkipRetry))
	require.NoError(t, err)
	_, err = f.q.RetryFailed(f.ctx, "")
	require.NoError(t, err)
	kept("RetryFailed", "a", 90*time.Second, deadline)

	later := deadline.Add(time.Hour)
	j, err := f.q.Update(f.ctx, "a", func(j *Job) error { j.Retention, j.Deadline = time.Hour, later; return nil })
	require.NoError(t, err)
	require.Equal(t, time.Hour, j.Retention)
	kept("Update of both", "a", time.Hour, later)
	_, err = f.q.Update(f.ctx, "a", func(j *Job) error { j.Retention, j.Deadline = 0, time.Time{}; return nil })
	require.NoError(t, err)
	kept("Update back to none", "a", 0, time.Time{})

	_, err = f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: opts("b")}, {Type: "t", Opts: opts("c")}})
	require.NoError(t, err)
	kept("EnqueueMany", "b", 90*time.Second, deadline)
	kept("EnqueueMany", "c", 90*time.Second, deadline)

	out, id, err := f.q.enqueueTick(f.ctx, PeriodicJob{Name: "p", Schedule: Every(time.Minute), Type: "t",
		Opts: &EnqueueOpts{Retention: 90 * time.Second, Deadline: deadline}}, f.clock.Now())
	require.NoError(t, err)
	require.Equal(t, tickWritten, out)
	kept("a periodic tick", id, 90*time.Second, deadline)
}

// A job removed by Delete is not counted as vanished. Claims keep due
// entries read ahead in a pool, and a claim that tries the entry of a job
// Delete removed finds no value. Delete is a legitimate jobkey call, not a
// job Redis lost: Stats.Vanished counts acknowledged jobs that are gone
// (deleted outside jobkey, or evicted), and a count there sends an operator
// looking for an eviction.
func TestDeletedJobIsNotCountedVanished(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true})
	var ids []string
	for range 2 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	c, err := f.q.Claim(f.ctx, "w") // the other entry goes to the pool
	require.NoError(t, err)
	other := ids[0]
	if other == c.ID {
		other = ids[1]
	}
	require.NoError(t, f.q.Delete(f.ctx, other))
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Vanished, "a job removed by Delete is not a job Redis lost")
}

// Delete of a job canceled while it ran keeps its ID taken while that run's
// lease may hold. The handler stops only when it sees the cancel hint or its
// next write is refused; as Retry of such a job waits for the old lease to
// end, an ID freed at once would let an idempotent producer (the documented
// use of EnqueueOpts.ID) enqueue it again and have it run beside the old
// handler. Here w1's lease lasts 30 s: after Cancel and Delete, an Enqueue
// of the same ID gives w2 nothing to claim.
func TestDeleteOfCanceledRunKeepsIDWhileLeaseHolds(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true, Lease: 30 * time.Second})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "order-42"})
	require.NoError(t, err)
	run1, err := f.q.Claim(f.ctx, "w1")
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, run1.ID)
	require.NoError(t, err)
	derr := f.q.Delete(f.ctx, run1.ID)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "order-42"})
	if derr == nil {
		require.NoError(t, err)
	}
	run2, err := f.q.Claim(f.ctx, "w2")
	if err == nil {
		t.Logf("Delete: %v; w2 claimed %s at %v while w1's lease runs until %v", derr, run2.ID, f.clock.Now(), run1.LeaseUntil)
	}
	require.ErrorIs(t, err, ErrNoJob, "a second run of %s while the first one's lease holds", run1.ID)
}
