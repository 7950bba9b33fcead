package jobkey

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// overlap counts the runs of a handler and the most that were inside it at
// once.
type overlap struct{ inside, most, runs atomic.Int32 }

// handler runs until its context ends, then takes stop to return, as a
// handler that cleans up does.
func (o *overlap) handler(stop time.Duration) Handler {
	return HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		n := o.inside.Add(1)
		o.runs.Add(1)
		for m := o.most.Load(); n > m && !o.most.CompareAndSwap(m, n); m = o.most.Load() {
		}
		defer o.inside.Add(-1)
		<-hctx.Done()
		time.Sleep(stop)
		return nil, hctx.Err()
	})
}

// stopTime is how long a canceled handler takes to return: well inside the
// lease a canceled run has left (at least two thirds of stopLease, as Work
// renews it every third), with room for the cancel to reach it.
const (
	stopLease = 3 * time.Second
	stopTime  = 500 * time.Millisecond
)

// canceledMidRun enqueues job "x" (with concurrency key key of limit limit,
// when key is set), runs it under Work, starts a rival Work that polls
// fast, and cancels x while it runs: its handler is still stopping when
// canceledMidRun returns.
func canceledMidRun(t *testing.T, key string, limit int) (*Queue, *overlap, *Job) {
	t.Helper()
	q := realQueue(t, &Config{Lease: stopLease})
	ctx := context.Background()
	if key != "" {
		require.NoError(t, q.SetConcurrencyLimit(ctx, key, limit))
	}
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: key})
	require.NoError(t, err)
	o := &overlap{}
	opts := func() *WorkOpts {
		return &WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond, ShutdownGrace: 100 * time.Millisecond}
	}
	startWork(t, q, o.handler(stopTime), opts())
	waitFor(t, "the first run", func() bool { return o.runs.Load() == 1 })
	startWork(t, q, o.handler(stopTime), opts())
	c, err := q.Cancel(ctx, "x")
	require.NoError(t, err)
	require.Equal(t, StateCanceled, c.State)
	return q, o, c
}

// keyCases are the concurrency keys under which a canceled run must not
// overlap the next: a key of limit 1 holds the canceled run's slot by
// itself, no key or a larger limit does not.
var keyCases = []struct {
	name  string
	key   string
	limit int
}{{"no key", "", 0}, {"limit 1", "k", 1}, {"limit 2", "k", 2}}

// An Update that moves RunAt to now, of a job canceled while it ran and
// then retried, makes it due when the canceled run's lease ends, not at
// once beside its handler, which is still stopping.
func TestUpdateOfCanceledRunWaitsForItsLease(t *testing.T) {
	t.Parallel()
	for _, tc := range keyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, o, c := canceledMidRun(t, tc.key, tc.limit)
			ctx := context.Background()
			_, err := q.Retry(ctx, "x")
			require.NoError(t, err)
			u, err := q.Update(ctx, "x", func(j *Job) error { j.RunAt = time.Now(); return nil })
			require.NoError(t, err)
			waitFor(t, "the second run", func() bool { return o.runs.Load() == 2 })
			time.Sleep(stopTime + 100*time.Millisecond)
			t.Logf("runs %d, most at once %d; Update wrote RunAt %v, the canceled run's lease ends %v",
				o.runs.Load(), o.most.Load(), u.RunAt, c.LeaseUntil)
			require.EqualValues(t, 1, o.most.Load(), "two runs of x were inside the handler at once")
			require.True(t, u.RunAt.Equal(c.LeaseUntil), "RunAt is moved to the end of the canceled run's lease")
		})
	}
}

// Delete of a job canceled while it ran and then retried is refused until
// the canceled run's lease ends: accepted, it freed the ID, and a job
// enqueued again under it ran at once beside the handler still stopping.
func TestDeleteOfRetriedCanceledRunWaitsForItsLease(t *testing.T) {
	t.Parallel()
	for _, tc := range keyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, o, c := canceledMidRun(t, tc.key, tc.limit)
			ctx := context.Background()
			_, err := q.Retry(ctx, "x")
			require.NoError(t, err)
			derr := q.Delete(ctx, "x")
			_, eerr := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: tc.key})
			waitFor(t, "the second run", func() bool { return o.runs.Load() == 2 })
			time.Sleep(stopTime + 100*time.Millisecond)
			t.Logf("Delete: %v; Enqueue: %v; runs %d, most at once %d", derr, eerr, o.runs.Load(), o.most.Load())
			require.EqualValues(t, 1, o.most.Load(), "two runs of x were inside the handler at once")
			var se *StateError
			require.ErrorAs(t, derr, &se)
			require.Equal(t, StatePending, se.State)
			require.True(t, se.Running.Equal(c.LeaseUntil), "the error names when the canceled run's lease ends")
			require.ErrorIs(t, eerr, ErrJobExists, "the ID stays taken")
		})
	}
}

// The last run's lease is the one in the value through Cancel, Retry and
// Cancel again: every write that would make the job due, or free its ID,
// waits for it, and none does once it has ended.
func TestLastRunLeaseHoldsThroughCancelAndRetry(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	run, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	end := run.LeaseUntil
	f.clock.Advance(time.Second)
	for range 2 {
		_, err = f.q.Cancel(f.ctx, "x")
		require.NoError(t, err)
		r, err := f.q.Retry(f.ctx, "x")
		require.NoError(t, err)
		require.True(t, r.RunAt.Equal(end), "Retry: due when the canceled run's lease ends")
	}
	u, err := f.q.Update(f.ctx, "x", func(j *Job) error { j.RunAt = f.clock.Now(); return nil })
	require.NoError(t, err)
	require.True(t, u.RunAt.Equal(end), "Update: RunAt %v moved to the lease's end %v", u.RunAt, end)
	f.requireIndexed(t, u)
	later, err := f.q.Update(f.ctx, "x", func(j *Job) error { j.RunAt = end.Add(time.Hour); return nil })
	require.NoError(t, err)
	require.True(t, later.RunAt.Equal(end.Add(time.Hour)), "a RunAt after the lease's end is kept")
	_, err = f.q.Update(f.ctx, "x", func(j *Job) error { j.RunAt = f.clock.Now(); return nil })
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob)

	var se *StateError
	require.ErrorAs(t, f.q.Delete(f.ctx, "x"), &se)
	require.True(t, se.Running.Equal(end))
	require.ErrorAs(t, f.q.DeleteIn(f.ctx, "x", StatePending), &se, "the move of a pending job (asynq rollback)")
	require.True(t, se.Running.Equal(end))
	_, err = f.q.Cancel(f.ctx, "x")
	require.NoError(t, err)
	res, err := f.q.DeleteFinished(f.ctx, StateCanceled, "")
	require.NoError(t, err)
	require.Equal(t, BulkResult{Skipped: 1}, res)
	_, err = f.q.Get(f.ctx, "x")
	require.NoError(t, err, "kept")

	f.clock.Advance(end.Sub(f.clock.Now()))
	_, err = f.q.Retry(f.ctx, "x")
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w2")
	require.NoError(t, err, "due once the lease ended")
	require.Equal(t, "x", c.ID)
}

// Complete, Fail and Release end the run's lease (the handler returned):
// an Update to now makes the job due at once, and Delete takes it.
func TestLastRunLeaseEndsWithItsOutcome(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	for _, outcome := range []string{"release", "fail"} {
		id := "x-" + outcome
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
		run, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		require.Equal(t, id, run.ID)
		if outcome == "release" {
			_, err = f.q.Release(f.ctx, run)
		} else {
			_, err = f.q.Fail(f.ctx, run, errors.New("boom")) // pending again, a minute ahead
		}
		require.NoError(t, err)
		now := f.clock.Now()
		u, err := f.q.Update(f.ctx, id, func(j *Job) error { j.RunAt = now; return nil })
		require.NoError(t, err)
		require.True(t, u.RunAt.Equal(now), "%s: nothing to wait for", outcome)
		again, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err, outcome)
		require.Equal(t, id, again.ID)
		_, err = f.q.Cancel(f.ctx, id)
		require.NoError(t, err)
		_, err = f.q.Release(f.ctx, again)
		require.ErrorIs(t, err, ErrLeaseLost)
		require.ErrorAs(t, f.q.Delete(f.ctx, id), new(*StateError), "%s: canceled while it ran again", outcome)
	}
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "done"})
	require.NoError(t, err)
	run, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, run, nil)
	require.NoError(t, err)
	require.NoError(t, f.q.Delete(f.ctx, "done"))
}

// A job canceled while it ran keeps its key, and so its ID, until the run's
// lease ends, however short Retention is: expired, the key freed the ID for
// a job enqueued again to run beside the canceled handler.
func TestCanceledRunKeepsItsIDPastRetention(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, Retention: time.Second})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "ran"})
	require.NoError(t, err)
	run, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "waited"})
	require.NoError(t, err)
	for _, id := range []string{"ran", "waited"} {
		_, err = f.q.Cancel(f.ctx, id)
		require.NoError(t, err)
	}
	ttl := func(id string) time.Duration {
		d, err := f.rdb.PTTL(f.ctx, f.q.Keys(id).Job).Result()
		require.NoError(t, err)
		return d
	}
	t.Logf("TTL of the canceled run's key %v, of the canceled pending job's %v", ttl(run.ID), ttl("waited"))
	require.Greater(t, ttl(run.ID), 50*time.Second, "the key outlives the run's lease")
	require.LessOrEqual(t, ttl("waited"), time.Second, "a job that never ran keeps its retention")
	require.NotEqual(t, redis.Nil, f.rdb.Get(f.ctx, f.q.Keys(run.ID).Job).Err())
}
