package jobkey

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Among due jobs a higher priority is claimed first, then, with a
// ClaimWindow of 1, the oldest RunAt of each shard within one; low
// priorities run once the high ones are drained. Stats counts the due jobs
// of each priority; List merges them by RunAt; Verify finds nothing wrong.
func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3, ClaimWindow: 1})
	base := f.clock.Now().Add(-time.Minute)
	low := map[string]bool{}
	for i := range 6 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{RunAt: base.Add(time.Duration(i) * time.Second)})
		require.NoError(t, err)
		low[j.ID] = true
	}
	for _, p := range []int{3, MaxPriority} {
		for i := range 4 {
			// Newer than every low job, and still first.
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Priority: p, RunAt: base.Add(time.Duration(10+i) * time.Second)})
			require.NoError(t, err)
		}
	}
	future, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Priority: MaxPriority, Delay: time.Hour})
	require.NoError(t, err)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), st.DueByPriority[0])
	require.Equal(t, int64(4), st.DueByPriority[3])
	require.Equal(t, int64(4), st.DueByPriority[MaxPriority])
	require.Equal(t, int64(14), st.Due)
	require.Equal(t, int64(1), st.Scheduled, "a scheduled job of the top priority waits for its RunAt")

	page, err := f.q.List(f.ctx, ListOpts{State: StatePending})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 15, "every priority's jobs, merged")
	for i := 1; i < len(page.Jobs); i++ {
		require.False(t, page.Jobs[i].RunAt.Before(page.Jobs[i-1].RunAt), "by RunAt")
	}
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)

	var got []*Job
	for range 14 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		got = append(got, c)
	}
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	for i, c := range got {
		switch {
		case i < 4:
			require.Equal(t, MaxPriority, c.Priority, "claim %d", i)
		case i < 8:
			require.Equal(t, 3, c.Priority, "claim %d", i)
		default:
			require.True(t, low[c.ID], "claim %d: the low priorities, once the high ones are drained", i)
		}
		for _, prev := range got[:i] {
			if prev.Priority == c.Priority && f.q.ks.shardOf(prev.ID) == f.q.ks.shardOf(c.ID) {
				require.False(t, c.RunAt.Before(prev.RunAt), "oldest RunAt of a shard first within a priority (claim %d)", i)
			}
		}
	}
	j, err := f.q.Get(f.ctx, future.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
}

// Work: a job of a higher priority enqueued while lower ones wait runs
// before them, though they were read ahead.
func TestPriorityWork(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil
	for range 50 {
		_, err := f.q.Enqueue(f.ctx, "low", nil, nil)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	var order []string
	gate := make(chan struct{})
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		done <- f.q.Work(ctx, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
			mu.Lock()
			order = append(order, j.Type)
			n := len(order)
			mu.Unlock()
			if n == 1 {
				<-gate // the first low job holds the one slot while the high one comes
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1, Logger: quiet})
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 1 }, 5*time.Second, 5*time.Millisecond)
	_, err := f.q.Enqueue(f.ctx, "high", nil, &EnqueueOpts{Priority: 5})
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // the wake-up hint reaches the worker
	close(gate)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) >= 3 }, 5*time.Second, 5*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "high", order[1], "the high job runs next: %v", order[:3])
}

func TestPriorityRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, p := range []int{-1, MaxPriority + 1} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Priority: p})
		require.ErrorIs(t, err, ErrInvalid, "%d", p)
	}
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Priority = MaxPriority + 1; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	j, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.Priority = 4; return nil })
	require.NoError(t, err)
	f.requireIndexed(t, j) // moved to its priority's index
	idx, _ := f.indexOf(t, j.ID)
	require.Equal(t, "ready.4", idx)
}

// A process that has never seen the queue use priorities reads only the
// ready index of priority 0, and the shards' flag: when another process
// enqueues a job of a higher priority, the next claim finds the flag, reads
// again every priority's index, and takes that job first.
func TestPriorityLearnedFromTheFlag(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, DisableGroupCommit: true})
	for range 3 {
		_, err := f.q.Enqueue(f.ctx, "low", nil, nil)
		require.NoError(t, err)
	}
	_, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.False(t, f.q.prios.Load())

	other := f.otherProcess(t, Config{Shards: 2})
	hi, err := other.Enqueue(f.ctx, "high", nil, &EnqueueOpts{Priority: 9})
	require.NoError(t, err)

	f.hook.Reset()
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, hi.ID, c.ID, "the job of priority 9 first")
	require.True(t, f.q.prios.Load())
	require.EqualValues(t, 4, f.hook.RTT.Load(), "one more round trip, once: the read again")
	f.hook.Reset()
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.EqualValues(t, 3, f.hook.RTT.Load())
}
