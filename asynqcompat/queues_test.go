package asynqcompat

import (
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
