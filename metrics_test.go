package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
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

// BatchCallbacks and EventsAppended count what an EXEC this process saw
// commit wrote: an EXEC whose reply was lost may have landed, and is not
// counted, nor is the retry that recognises it (it writes nothing). They
// never count a write twice, and never one that did not land.
func TestMetricsCountTheWritesSeenToCommitOnce(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	q := queueOn(t, cut, fmt.Sprint("metrics-lost-", rand.Int64()), Config{})
	ctx := context.Background()
	require.NoError(t, q.EnableEvents(ctx))
	b, ids, err := q.EnqueueBatch(ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "m1"}}}, JobSpec{Type: "cb"}, &BatchOpts{ID: "mb"})
	require.NoError(t, err)
	require.NotNil(t, b)
	m := q.Metrics()
	require.EqualValues(t, 0, m.BatchCallbacks)
	require.EqualValues(t, 1, m.EventsAppended, "the batch's job")
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, ids[0], j.ID)
	require.EqualValues(t, 2, q.Metrics().EventsAppended)

	// Its completion fires the callback; the reply is lost.
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	_, err = q.Complete(ctx, j, nil)
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err, "the retry recognises its own completion")
	require.NotZero(t, proxy.Counts().ExecCuts)

	evs, _ := readEvents(t, q, "")
	require.Equal(t, []step{
		{kind: EventEnabled},
		{EventTransition, "m1", 0, StatePending, 0, ""},
		{EventTransition, "m1", StatePending, StateActive, 1, "w"},
		{EventTransition, "m1", StateActive, StateSucceeded, 1, "w"},
		{EventTransition, "mb", 0, StatePending, 0, ""},
	}, steps(evs), "the lost EXEC landed with the callback and both events")
	m = q.Metrics()
	require.EqualValues(t, 0, m.BatchCallbacks, "the lost EXEC's callback is not counted, nor by the retry")
	require.EqualValues(t, 2, m.EventsAppended, "nor are its events")

	// Seen to commit: counted once.
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, "mb", c.ID)
	require.EqualValues(t, 3, q.Metrics().EventsAppended)
}

// Under lost replies and reset connections, Work's counters never exceed
// what the stream holds and the batch fired.
func TestMetricsUnderLostRepliesNeverExceedTheStream(t *testing.T) {
	t.Parallel()
	q, direct, proxy := lostRepliesPair(t, "metrics-work-lost")
	ctx := context.Background()
	const jobs = 30
	for i := range jobs {
		_, err := direct.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i), MaxAttempts: 5})
		require.NoError(t, err)
	}
	for i := range 3 {
		_, _, err := direct.EnqueueBatch(ctx, []JobSpec{{Type: "t"}, {Type: "t"}}, JobSpec{Type: "t"}, &BatchOpts{ID: fmt.Sprint("cb", i)})
		require.NoError(t, err)
	}
	var runs atomic.Int64
	proxy.Set(faultproxy.Faults{ExecCutProb: 0.2, ResetProb: 0.002})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if runs.Add(1)%4 == 0 && j.Attempt == 1 {
			return nil, errors.New("once more")
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond})
	waitForIn(t, 60*time.Second, "every job done", func() bool {
		st, err := direct.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded >= jobs+9 && st.Pending == 0 && st.Active == 0
	})
	proxy.Set(faultproxy.Faults{})
	stop()
	evs, _ := readEvents(t, direct, "")
	transitions := 0
	for _, e := range evs {
		if e.Kind == EventTransition {
			transitions++
		}
	}
	m, d := q.Metrics(), direct.Metrics()
	require.LessOrEqual(t, m.EventsAppended+d.EventsAppended, int64(transitions))
	require.LessOrEqual(t, m.BatchCallbacks+d.BatchCallbacks, int64(3), "three batches fire once each")
	require.EqualValues(t, jobs+6, d.EventsAppended, "the direct enqueues, none lost")
	if proxy.Counts().ExecCuts == 0 && proxy.Counts().Resets == 0 {
		require.EqualValues(t, transitions, m.EventsAppended+d.EventsAppended)
		require.EqualValues(t, 3, m.BatchCallbacks)
	}
	require.NotZero(t, m.EventsAppended)
}
