package jobkey

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Queue.Metrics counts what this process's Works recorded, each outcome
// under its own name, and how many runners they have and how many of
// them run a handler.
func TestMetricsCountWhatWorkRecordedOfItsRuns(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Backoff: func(int) time.Duration { return time.Hour }})
	ctx := context.Background()
	for _, s := range []struct {
		id  string
		max int
	}{{"ok", 3}, {"retry", 3}, {"final", 1}, {"skip", 3}, {"cancel", 3}, {"snooze", 1}} {
		_, err := q.Enqueue(ctx, s.id, nil, &EnqueueOpts{ID: s.id, MaxAttempts: s.max})
		require.NoError(t, err)
	}
	running := make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		switch j.ID {
		case "ok":
			return nil, nil
		case "cancel":
			close(running)
			<-ctx.Done()
			return nil, ctx.Err()
		case "skip":
			return nil, fmt.Errorf("bad input: %w", ErrSkipRetry)
		case "snooze":
			return nil, Snooze(time.Hour)
		}
		return nil, errors.New("boom")
	}), &WorkOpts{Concurrency: 3})
	<-running
	m := q.Metrics()
	require.EqualValues(t, 3, m.Runners)
	require.GreaterOrEqual(t, m.BusyRunners, int64(1), "the canceled job's handler runs")
	_, err := q.Cancel(ctx, "cancel")
	require.NoError(t, err)
	waitFor(t, "every outcome recorded", func() bool {
		m := q.Metrics()
		return m.Succeeded == 1 && m.AttemptsFailed == 3 && m.Canceled == 1 && m.Snoozed == 1
	})
	stop()
	m = q.Metrics()
	require.EqualValues(t, 1, m.Succeeded)
	require.EqualValues(t, 3, m.AttemptsFailed, "retry, final and skip")
	require.EqualValues(t, 1, m.RetriesScheduled, "retry, back to pending under the backoff")
	require.EqualValues(t, 2, m.FailedForGood, "final (no attempt left) and skip (ErrSkipRetry)")
	require.EqualValues(t, 1, m.Canceled)
	require.EqualValues(t, 1, m.Snoozed, "a snooze spends no attempt, and is no failure")
	require.Zero(t, m.Released)
	require.Zero(t, m.Runners, "Work returned")
	require.Zero(t, m.BusyRunners)
}

// A run given back unrun at shutdown is counted as released, not as a
// failed attempt.
func TestMetricsCountARunGivenBackAtShutdownAsReleased(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "long"})
	require.NoError(t, err)
	started := make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}), &WorkOpts{Concurrency: 1, ShutdownGrace: time.Millisecond})
	<-started
	stop()
	m := q.Metrics()
	require.EqualValues(t, 1, m.Released)
	require.Zero(t, m.AttemptsFailed)
	j, err := q.Get(ctx, "long")
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	require.Zero(t, j.Attempt)
}
