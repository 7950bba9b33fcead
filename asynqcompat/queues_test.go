package asynqcompat

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

func TestWorkQueuesMapsAsynqsQueueOptions(t *testing.T) {
	e := newEnv(t)
	crit, def, low := e.queue(t, "critical", nil), e.queue(t, "default", nil), e.queue(t, "low", nil)
	qs, opts, err := WorkQueues(asynq.Config{Queues: map[string]int{"low": 1, "critical": 6, "default": 3}, StrictPriority: true,
		Concurrency: 7, ShutdownTimeout: 3 * time.Second}, map[string]*jobkey.Queue{"critical": crit, "default": def, "low": low})
	require.NoError(t, err)
	require.Equal(t, []jobkey.WeightedQueue{{Queue: crit, Weight: 6}, {Queue: def, Weight: 3}, {Queue: low, Weight: 1}}, qs)
	require.True(t, opts.StrictPriority)
	require.Equal(t, 7, opts.Concurrency)
	require.Equal(t, 3*time.Second, opts.ShutdownGrace)

	qs, opts, err = WorkQueues(asynq.Config{}, map[string]*jobkey.Queue{"default": def})
	require.NoError(t, err)
	require.Equal(t, []jobkey.WeightedQueue{{Queue: def, Weight: 1}}, qs, "asynq's default queues")
	require.Equal(t, runtime.NumCPU(), opts.Concurrency, "asynq's default concurrency")

	_, _, err = WorkQueues(asynq.Config{Queues: map[string]int{"critical": 6, "other": 1}}, map[string]*jobkey.Queue{"critical": crit})
	require.ErrorIs(t, err, jobkey.ErrInvalid)
	require.ErrorContains(t, err, `"other"`)
	_, _, err = WorkQueues(asynq.Config{Queues: map[string]int{"critical": 0}}, map[string]*jobkey.Queue{"critical": crit})
	require.ErrorIs(t, err, jobkey.ErrInvalid)
}

// An asynq Config's RetryDelayFunc and IsFailure become the WorkQueues'
// retry policy; with neither, each queue's own Backoff decides.
func TestWorkQueuesMapsRetryDelayFuncAndIsFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "default", nil)
	errBusy := errors.New("busy")
	_, opts, err := WorkQueues(asynq.Config{
		RetryDelayFunc: func(n int, err error, task *asynq.Task) time.Duration { return time.Duration(n+1) * time.Minute },
		IsFailure:      func(err error) bool { return !errors.Is(err, errBusy) },
	}, map[string]*jobkey.Queue{"default": q})
	require.NoError(t, err)
	require.NotNil(t, opts.RetryPolicy)
	d := opts.RetryPolicy(&jobkey.Job{Type: "t", Attempt: 2, MaxAttempts: 5}, errBusy)
	require.Equal(t, jobkey.RetryDecision{Delay: 2 * time.Minute, Snooze: true}, d)

	_, opts, err = WorkQueues(asynq.Config{}, map[string]*jobkey.Queue{"default": q})
	require.NoError(t, err)
	require.Nil(t, opts.RetryPolicy, "the queue's Config.Backoff decides")
}
