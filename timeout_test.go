package jobkey

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A run past the job's Timeout has its context ended with ErrTimeout; the
// attempt fails with a cause that says "timeout", and the job is retried
// under the backoff. WorkOpts.Timeout serves jobs without one of their own.
func TestTimeoutFailsTheAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil // Work's leases run on real time
	short, err := f.q.Enqueue(f.ctx, "slow", nil, &EnqueueOpts{Timeout: 100 * time.Millisecond, MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, short.Timeout)
	byDefault, err := f.q.Enqueue(f.ctx, "slow", nil, nil)
	require.NoError(t, err)
	long, err := f.q.Enqueue(f.ctx, "slow", nil, &EnqueueOpts{Timeout: time.Minute})
	require.NoError(t, err)

	var mu sync.Mutex
	causes := map[string]error{}
	ended := map[string]time.Time{}     // when the handler saw its ctx end
	deadlines := map[string]time.Time{} // its ctx's deadline
	started := map[string]time.Time{}
	recorded := make(chan string, 3)
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		done <- f.q.Work(ctx, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
			start := time.Now()
			dl, _ := ctx.Deadline()
			select {
			case <-ctx.Done():
			case <-time.After(400 * time.Millisecond):
			}
			mu.Lock()
			causes[j.ID], ended[j.ID], deadlines[j.ID], started[j.ID] = context.Cause(ctx), time.Now(), dl, start
			mu.Unlock()
			return nil, ctx.Err()
		}), &WorkOpts{Concurrency: 3, Timeout: 150 * time.Millisecond, Logger: quiet,
			OnRecorded: func(j *Job, _ error) { recorded <- j.ID }})
	}()
	for range 3 {
		select {
		case <-recorded:
		case <-time.After(10 * time.Second):
			t.Fatal("the runs were not recorded")
		}
	}
	stop()
	require.NoError(t, <-done)

	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{short.ID, byDefault.ID} {
		require.ErrorIs(t, causes[id], ErrTimeout, id)
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatePending, j.State, "retried under the backoff")
		require.Equal(t, 1, j.Attempt)
		require.Contains(t, j.LastError, "timeout")
	}
	// Which timeout ended each run, by the cause it wrote, not by timing.
	for id, want := range map[string]string{short.ID: "timeout of 100ms", byDefault.ID: "timeout of 150ms"} {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Contains(t, j.LastError, want)
	}
	// Not before WorkOpts.Timeout: the run's ctx ended at its deadline or
	// after, and that deadline is 150 ms from when Work set it, a moment
	// before it called the handler: at most 150 ms after the handler
	// began, and more than the short job's 100 ms. (Timing the handler
	// alone against 150 ms once gave 149.98 ms under load.)
	dl := deadlines[byDefault.ID]
	require.False(t, dl.IsZero(), "the run has a deadline")
	require.False(t, ended[byDefault.ID].Before(dl), "ended before its deadline")
	require.LessOrEqual(t, dl.Sub(started[byDefault.ID]), 150*time.Millisecond, "a deadline past WorkOpts.Timeout")
	require.Greater(t, dl.Sub(started[byDefault.ID]), 100*time.Millisecond, "a deadline short of WorkOpts.Timeout")
	require.NoError(t, causes[long.ID], "a job's own timeout wins over the default")
	j, err := f.q.Get(f.ctx, long.ID)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, j.State)
}

// The Timeout is stored with the job: checked, rounded up to whole
// milliseconds, and editable with Update.
func TestTimeoutIsStored(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, d := range []time.Duration{-time.Second, MaxTimeout + time.Millisecond} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Timeout: d})
		require.ErrorIs(t, err, ErrInvalid, "%v", d)
	}
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Timeout: 1500 * time.Microsecond})
	require.NoError(t, err)
	require.Equal(t, 2*time.Millisecond, j.Timeout, "rounded up")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, 2*time.Millisecond, got.Timeout)
	j, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Timeout = time.Hour; return nil })
	require.NoError(t, err)
	require.Equal(t, time.Hour, j.Timeout)
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Timeout = -1; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, time.Hour, c.Timeout, "kept by the claim")
	_, err = (&Queue{}).workOpts(&WorkOpts{Timeout: -1})
	require.True(t, errors.Is(err, ErrInvalid))
}
