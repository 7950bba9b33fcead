package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// A routed task without MaxRetry is tried as often as asynq tries it, and
// with DefaultBackoff its first retry waits as long as asynq's.
func TestRoutedTaskRetriesAsAsynqDoes(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Backoff: DefaultBackoff})
	c := NewClient(nil, []Route{{Type: "email:welcome", To: q}})
	info, err := c.Enqueue(asynq.NewTask("email:welcome", nil), asynq.TaskID("a"))
	require.NoError(t, err)
	require.Equal(t, 25, info.MaxRetry, "asynq's default")
	j, err := q.Get(e.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, 26, j.MaxAttempts)

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(context.Context, *asynq.Task) error { return errors.New("boom") }),
			&jobkey.WorkOpts{PollInterval: 20 * time.Millisecond})
	}()
	require.Eventually(t, func() bool {
		j, err = q.Get(e.ctx, "a")
		return err == nil && j.Attempt == 1 && j.State == jobkey.StatePending
	}, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	wait := j.RunAt.Sub(j.UpdatedAt)
	require.GreaterOrEqual(t, wait, 15*time.Second, "asynq's first retry waits 15s to 44s")
	require.LessOrEqual(t, wait, 45*time.Second)
}

// RetryDelay gives an asynq RetryDelayFunc the retry count asynq would:
// 0 after the first run failed.
func TestRetryDelayPassesAsynqRetryCount(t *testing.T) {
	t.Parallel()
	var got []int
	b := RetryDelay(func(n int, err error, task *asynq.Task) time.Duration {
		got = append(got, n)
		require.ErrorIs(t, err, ErrRunErrorUnknown)
		require.NotNil(t, task)
		return time.Duration(n) * time.Second
	})
	require.Equal(t, time.Duration(0), b(1))
	require.Equal(t, 2*time.Second, b(3))
	require.Equal(t, []int{0, 2}, got)
	for attempt := 1; attempt <= 3; attempt++ {
		d := DefaultBackoff(attempt)
		n := attempt - 1
		require.GreaterOrEqual(t, d, time.Duration(n*n*n*n+15)*time.Second)
		require.Less(t, d, time.Duration(n*n*n*n+15+30*(n+1))*time.Second)
	}
	// A func that panics, or returns a negative delay, gets asynq's default.
	for _, f := range []asynq.RetryDelayFunc{
		func(int, error, *asynq.Task) time.Duration { panic("boom") },
		func(int, error, *asynq.Task) time.Duration { return -time.Second },
	} {
		d := RetryDelay(f)(1)
		require.GreaterOrEqual(t, d, 15*time.Second)
	}
}

// RetryPolicy gives asynq's RetryDelayFunc the run's error and task, and an
// error IsFailure does not count is retried without spending the attempt,
// as asynq retries it without counting a retry.
func TestRetryPolicyMapsRetryDelayFuncAndIsFailure(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "webhooks", nil)
	errBusy := errors.New("receiver busy")
	var seen []string
	delay := func(n int, err error, task *asynq.Task) time.Duration {
		seen = append(seen, fmt.Sprintf("%d %s %s %v", n, task.Type(), task.Payload(), err))
		return time.Duration(n+1) * time.Hour
	}
	isFailure := func(err error) bool { return !errors.Is(err, errBusy) }
	p := RetryPolicy(delay, isFailure)

	for _, c := range []struct {
		err     error
		snooze  bool
		attempt int
	}{{errBusy, true, 1}, {errors.New("boom"), false, 1}, {errors.New("boom"), false, 3}} {
		j := &jobkey.Job{Type: "hook:send", Payload: []byte("p"), Attempt: c.attempt, MaxAttempts: 5}
		d := p(j, c.err)
		require.Equal(t, c.snooze, d.Snooze, "%v", c.err)
		require.False(t, d.GiveUp)
		require.Equal(t, time.Duration(c.attempt)*time.Hour, d.Delay)
	}
	require.Equal(t, []string{"0 hook:send p receiver busy", "0 hook:send p boom", "2 hook:send p boom"}, seen)

	// Under Work: the busy receiver's run gives its attempt back.
	_, err := q.Enqueue(e.ctx, "hook:send", nil, &jobkey.EnqueueOpts{ID: "h", MaxAttempts: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(context.Context, *asynq.Task) error { return errBusy }),
			&jobkey.WorkOpts{RetryPolicy: RetryPolicy(nil, isFailure), PollInterval: 20 * time.Millisecond})
	}()
	var j *jobkey.Job
	require.Eventually(t, func() bool {
		j, err = q.Get(e.ctx, "h")
		return err == nil && j.Snoozes == 1 && j.State == jobkey.StatePending
	}, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Zero(t, j.Attempt, "its one attempt is left")
	wait := j.RunAt.Sub(j.UpdatedAt)
	require.GreaterOrEqual(t, wait, 15*time.Second, "asynq's default delay for the first retry")
}
