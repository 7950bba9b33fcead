package jobkey

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// idOnShard returns an ID with the given prefix that q places on shard s.
func idOnShard(q *Queue, prefix string, s int) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if q.ks.shardOf(id) == s {
			return id
		}
	}
}

// runLog records the jobs a handler ran, in order.
type runLog struct {
	mu   sync.Mutex
	jobs []*Job
}

func (l *runLog) add(j *Job) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, j)
	return len(l.jobs)
}

func (l *runLog) snapshot() []*Job {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Job(nil), l.jobs...)
}

func waitRuns(t *testing.T, l *runLog, n int) []*Job {
	t.Helper()
	require.Eventually(t, func() bool { return len(l.snapshot()) >= n }, 10*time.Second, 5*time.Millisecond)
	return l.snapshot()
}

// DEFECT: Work's fused complete-and-claim reads ahead only the shards of
// the jobs it completes (finishTxn passes txnKeys' shards to readAhead) and
// replaces the whole read-ahead pool with that read, which the next claim
// (fused or Claim's round 0) takes from on a single Redis with no further
// read. So on 4 shards (a claim reads all of them; README: only "more than
// 4 shards" bounds the order besides the pool's drop on enqueue), a
// priority-9 job enqueued on shard 1 while a shard-0 job runs (the pool IS
// dropped below 9 by the enqueue) is passed over: the completion refills
// the pool from shard 0 alone and the slot's next claim takes a priority-0
// job of shard 0. Observed: the run after the first was a priority-0 job of
// shard 0 while the priority-9 job had been due on shard 1 since the first
// run.
func TestBreak15FusedReadAheadReadsOnlyCompletedShard(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	f.q.clock.fake = nil
	q := f.q
	for i := range 4 {
		_, err := q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, fmt.Sprintf("low%d-", i), 0)})
		require.NoError(t, err)
	}
	hi := idOnShard(q, "hi-", 1)
	var log runLog
	startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: hi, Priority: MaxPriority})
			if err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond) // the wake-up hint "p9" arrives too
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, hi, got[1].ID, "run 2 must be the due priority-9 job, got %s (priority %d, shard %d)",
		got[1].ID, got[1].Priority, q.ks.shardOf(got[1].ID))
}

// DEFECT: Retry of a priority job from another process publishes the job's
// ID as the wake-up hint, not "p<priority>", so a Work elsewhere keeps its
// read-ahead entries of lower priorities and claims one of them (in the
// fused complete-and-claim) before the retried job, due at once. Enqueue
// of the same job would have dropped them (wakeHint). Observed: after
// Retry of a priority-9 job during run 1, run 2 was a priority-0 job.
func TestBreak15RetryOfPriorityJobDoesNotDropOthersReadAhead(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.fake = nil
	admin, err := NewQueue(f.rdb, "q", &f.q.cfg) // another process's Queue
	require.NoError(t, err)
	hi, err := admin.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "hi-retried", Priority: MaxPriority, MaxAttempts: 1})
	require.NoError(t, err)
	c, err := admin.Claim(f.ctx, "x")
	require.NoError(t, err)
	require.Equal(t, hi.ID, c.ID)
	_, err = admin.Fail(f.ctx, c, fmt.Errorf("boom"))
	require.NoError(t, err)
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	var log runLog
	startWork(t, f.q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			r, err := admin.Retry(ctx, hi.ID)
			if err != nil {
				return nil, err
			}
			if r.State != StatePending {
				return nil, fmt.Errorf("retry left %s", r.State)
			}
			time.Sleep(50 * time.Millisecond) // the hint arrives
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, hi.ID, got[1].ID, "run 2 must be the retried priority-9 job, got %s (priority %d)", got[1].ID, got[1].Priority)
}

// DEFECT: a plain Claim (no Work in the process) fills the read-ahead pool
// with what it did not take and claims from it next, but nothing drops it
// when another process enqueues a higher priority: only Work listens to
// the "p<N>" hints. README: "A claim takes the due jobs of a higher
// priority before any of a lower one", bounded only by Work's read-ahead
// and more than 4 shards. Observed: one shard, Claim after another Queue
// enqueued a priority-9 job returned a priority-0 job.
func TestBreak15ClaimPoolIgnoresOtherProcessEnqueue(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.fake = nil
	other, err := NewQueue(f.rdb, "q", &f.q.cfg)
	require.NoError(t, err)
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	first, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Zero(t, first.Priority)
	hi, err := other.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "hi", Priority: MaxPriority})
	require.NoError(t, err)
	second, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, hi.ID, second.ID, "claimed %s (priority %d) while priority 9 was due", second.ID, second.Priority)
}

// DEFECT: on a cluster, claimBatch keeps the candidates of the FIRST
// candidate's shard (sameShard) before ordering by priority (pickBlock),
// and candidates come in shard order. So ClaimMany (and a group-committed
// Claim batch) takes shard 0's priority-0 jobs while a priority-9 job is
// due on shard 1, with 3 shards (a claim reads all of them). Observed:
// ClaimMany(n=1) returned the priority-0 job of shard 0.
func TestBreak15ClusterClaimManyIgnoresHigherPriorityOnOtherShard(t *testing.T) {
	redistest.RequireReal(t)
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Shards: 3})
	require.NoError(t, err)
	low, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, "low-", 0)})
	require.NoError(t, err)
	hi, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, "hi-", 1), Priority: MaxPriority})
	require.NoError(t, err)
	_ = low
	got, err := q.ClaimMany(ctx, "w", 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, hi.ID, got[0].ID, "ClaimMany took %s (priority %d, shard %d) while priority 9 was due on shard 1",
		got[0].ID, got[0].Priority, q.ks.shardOf(got[0].ID))
}

// DEFECT: Update that makes a pending job due now at priority 9 (RunAt and
// Priority are both editable) from another process publishes no wake-up
// hint at all, so a Work elsewhere keeps its read-ahead entries of lower
// priorities and claims one of them (in the fused complete-and-claim)
// before the job now due at priority 9. Observed: after that Update during
// run 1, run 2 was a priority-0 job.
func TestBreak15UpdateRaisingPriorityDoesNotDropOthersReadAhead(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.fake = nil
	admin, err := NewQueue(f.rdb, "q", &f.q.cfg) // another process's Queue
	require.NoError(t, err)
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	later, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "later", Delay: time.Hour})
	require.NoError(t, err)
	var log runLog
	startWork(t, f.q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			_, err := admin.Update(ctx, later.ID, func(u *Job) error {
				u.Priority, u.RunAt = MaxPriority, time.Now().Add(-time.Second)
				return nil
			})
			if err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, later.ID, got[1].ID, "run 2 must be the job made due at priority 9, got %s (priority %d)", got[1].ID, got[1].Priority)
}
