package jobkey

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// burn enqueues n jobs and runs them to the end with nop handlers on
// Concurrency slots and prefetch, counting each job's runs; it returns the
// Queue's metrics once every job succeeded.
func burn(t *testing.T, n, slots, prefetch int) MetricsSnapshot {
	t.Helper()
	q := realQueue(t, nil)
	ctx := context.Background()
	for range n {
		_, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		return nil, nil
	}), &WorkOpts{Concurrency: slots, Prefetch: prefetch})
	waitFor(t, "every job succeeded", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == int64(n)
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, n)
	for id, k := range runs {
		require.Equal(t, 1, k, "job %s ran %d times", id, k)
	}
	return q.Metrics()
}

// largest returns the upper bound of the largest bucket of s that counted
// a batch (BatchSizes.Buckets[i]: more than 2^(i-1), at most 2^i calls).
func largest(s BatchSizes) int {
	for i := len(s.Buckets) - 1; i >= 0; i-- {
		if s.Buckets[i] > 0 {
			return 1 << i
		}
	}
	return 0
}

func TestWorkWritesManyRunsSuccessesInOneTransaction(t *testing.T) {
	t.Parallel()
	const slots = 2
	m := burn(t, 300, slots, 0)
	require.Positive(t, m.Prefetched, "jobs were claimed ahead of the slots")
	require.Greater(t, largest(m.FinishBatches), slots,
		"a transaction finished more runs than there are slots: %+v", m.FinishBatches)
	require.EqualValues(t, 300, m.Succeeded)

	// Without it, a transaction finishes at most one run per slot.
	off := burn(t, 100, slots, -1)
	require.Zero(t, off.Prefetched)
	require.LessOrEqual(t, largest(off.FinishBatches), slots, "%+v", off.FinishBatches)
}

func TestWorkGivesBackTheJobsHeldAheadWhenItStops(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	var ids []string
	for range 100 {
		j, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	var handled atomic.Int32
	reached, proceed := make(chan struct{}), make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if handled.Add(1) == 40 {
			close(reached)
			<-proceed // holds the one slot while Work stops
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1, Prefetch: 4})
	<-reached
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(20 * time.Millisecond) // Work's ctx has ended: what it holds ahead goes back
	close(proceed)
	<-stopped
	m := q.Metrics()
	require.Positive(t, m.Prefetched)
	require.Positive(t, m.PrefetchReturned, "the jobs held ahead went back unrun")
	var succeeded int32
	for _, id := range ids {
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		switch j.State {
		case StateSucceeded:
			succeeded++
		case StatePending:
			require.Zero(t, j.Attempt, "job %s went back with its attempt unspent", id)
		default:
			t.Fatalf("job %s is %s once Work returned", id, j.State)
		}
	}
	require.Equal(t, handled.Load(), succeeded, "every run that returned was recorded, and no other")
}

func TestWorkGivesBackTheJobsHeldAheadWhileEverySlotRunsLong(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	const n = 60
	for range n {
		_, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var handled atomic.Int32
	started, proceed := make(chan struct{}), make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if handled.Add(1) == 20 {
			close(started)
			<-proceed // the one slot runs long
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1, Prefetch: 2})
	defer stop()
	<-started
	// While the one slot is busy, this Work holds no job but the one it
	// runs: what it held ahead goes back, for another worker to take.
	waitFor(t, "the jobs held ahead given back", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Active == 1 && q.Metrics().PrefetchReturned > 0
	})
	close(proceed)
	waitFor(t, "every job succeeded", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == n
	})
	require.EqualValues(t, n, handled.Load(), "each job ran once")
}
