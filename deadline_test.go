package jobkey

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// workUntilRecorded runs Work with h until n outcomes are recorded.
func workUntilRecorded(t *testing.T, f *fixture, n int, o WorkOpts, h HandlerFunc) {
	t.Helper()
	recorded := make(chan string, n)
	o.Logger, o.OnRecorded = quiet, func(j *Job, _ error) { recorded <- j.ID }
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.q.Work(ctx, h, &o) }()
	for range n {
		select {
		case <-recorded:
		case <-time.After(10 * time.Second):
			t.Fatal("the runs were not recorded")
		}
	}
	stop()
	require.NoError(t, <-done)
}

// A run still going at the job's Deadline has its context ended then
// (ctx.Err() is context.DeadlineExceeded, the cause ErrDeadline), even
// with a longer Timeout: the handler's deadline is the sooner of the two.
// The attempt fails and the job is retried under the backoff, as asynq
// retries a task whose deadline was exceeded; a shorter Timeout still
// wins over a later Deadline.
func TestDeadlineEndsTheRunAndTheAttemptIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil // Work's leases run on real time
	soon := time.Now().Add(300 * time.Millisecond)
	byDeadline, err := f.q.Enqueue(f.ctx, "slow", nil, &EnqueueOpts{Deadline: soon, Timeout: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, soon.UTC().Truncate(time.Millisecond), byDeadline.Deadline)
	byTimeout, err := f.q.Enqueue(f.ctx, "slow", nil, &EnqueueOpts{Deadline: time.Now().Add(time.Hour), Timeout: 100 * time.Millisecond, MaxAttempts: 3})
	require.NoError(t, err)

	var mu sync.Mutex
	causes, errs, ended := map[string]error{}, map[string]error{}, map[string]time.Time{}
	workUntilRecorded(t, f, 2, WorkOpts{Concurrency: 2}, func(ctx context.Context, j *Job) ([]byte, error) {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		mu.Lock()
		causes[j.ID], errs[j.ID], ended[j.ID] = context.Cause(ctx), ctx.Err(), time.Now()
		mu.Unlock()
		return nil, ctx.Err()
	})

	mu.Lock()
	defer mu.Unlock()
	require.ErrorIs(t, causes[byDeadline.ID], ErrDeadline)
	require.ErrorIs(t, errs[byDeadline.ID], context.DeadlineExceeded)
	// Counted from when the claim was asked for, the run ends at most that
	// claim's round trip before the Deadline, never after it.
	require.False(t, ended[byDeadline.ID].Before(soon.Add(-100*time.Millisecond)), "not well before the Deadline")
	require.ErrorIs(t, causes[byTimeout.ID], ErrTimeout)
	for id, want := range map[string]string{byDeadline.ID: "deadline", byTimeout.ID: "timeout"} {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatePending, j.State, "retried under the backoff")
		require.Equal(t, 1, j.Attempt)
		require.Contains(t, j.LastError, want)
	}
}

// A job claimed once its Deadline has passed is not run, as asynq does not
// run a task whose context is already done: the attempt fails at once
// with ErrDeadline (context.DeadlineExceeded), and the job is retried
// while attempts remain, then fails for good, as asynq archives it.
func TestDeadlinePassedBeforeTheClaimFailsTheAttemptUnrun(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Backoff: func(int) time.Duration { return 0 }})
	f.q.clock.Fake = nil
	past := time.Now().Add(-time.Minute)
	j, err := f.q.Enqueue(f.ctx, "late", nil, &EnqueueOpts{Deadline: past, MaxAttempts: 2})
	require.NoError(t, err, "a Deadline already past is taken, as asynq takes it")

	var mu sync.Mutex
	ran := 0
	var last error
	recorded := make(chan struct{}, 2)
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		done <- f.q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			mu.Lock()
			ran++
			mu.Unlock()
			return nil, nil
		}), &WorkOpts{Logger: quiet, PollInterval: 10 * time.Millisecond, OnRecorded: func(j *Job, err error) {
			mu.Lock()
			last = err
			mu.Unlock()
			recorded <- struct{}{}
		}})
	}()
	for range 2 {
		select {
		case <-recorded:
		case <-time.After(10 * time.Second):
			t.Fatal("the attempts were not recorded")
		}
	}
	stop()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, ran, "the handler never ran")
	require.NoError(t, last)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateFailed, got.State, "both attempts spent")
	require.Equal(t, 2, got.Attempt)
	require.Contains(t, got.LastError, "deadline")
	require.Contains(t, got.LastError, context.DeadlineExceeded.Error())
	require.Contains(t, got.LastError, "not run")
}

// The Deadline is checked at enqueue and by Update: within 1970..9999, and
// not the Unix epoch itself, which a value stores as none; it is kept to
// the millisecond in UTC, and read back with the job.
func TestDeadlineIsChecked(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, d := range []time.Time{time.Unix(0, 0), time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Deadline: d})
		require.ErrorIs(t, err, ErrInvalid, "%v", d)
	}
	at := time.Date(2027, 1, 2, 3, 4, 5, 678901234, time.FixedZone("x", 3600))
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Deadline: at})
	require.NoError(t, err)
	require.Equal(t, at.UTC().Truncate(time.Millisecond), j.Deadline)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, j.Deadline, got.Deadline)
	none, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	require.True(t, none.Deadline.IsZero())
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Deadline = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC); return nil })
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Retention = -time.Second; return nil })
	require.ErrorIs(t, err, ErrInvalid)
}
