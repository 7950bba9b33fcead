package jobkey

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Defect: on a cluster, a Claim whose caller's deadline passes while the
// due read is in flight (a slow link, a short per-call timeout) marks the
// shards it was reading as down: dueIn treats every non-Redis error of a
// read, context.DeadlineExceeded included, as "the node could not be
// reached". For the next 2s every Enqueue, Complete, Fail... of a job in
// those shards fails at once with "the node of shard N could not be
// reached", on a cluster whose every node is up and answering.
func TestBreak2ClaimTimeoutMarksHealthyShardsDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	var slow atomic.Bool
	rdb := cl.Client(t, nil)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slow.Load() && has(cmds, "zrangebyscore", ":ready") {
			<-ctx.Done() // the link is slow: the caller's deadline passes first
		}
		return nil
	}))
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Logger: quietLog()})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	slow.Store(true)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = q.Claim(short, "w")
	cancel()
	slow.Store(false)
	require.Error(t, err, "the caller gave up")

	failed := 0
	var first error
	for i := range 32 {
		if _, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("after-%d", i)}); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	require.Zero(t, failed, "every node is up, yet %d of 32 enqueues failed, e.g.: %v", failed, first)
}

// The same without any hook: a Claim called with a context that has
// already ended (DisableGroupCommit, so it is not refused up front) marks
// every shard of the healthy cluster down.
func TestBreak2CanceledClaimMarksEveryShardDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Logger: quietLog(), DisableGroupCommit: true})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = q.Claim(gone, "w")
	require.ErrorIs(t, err, context.Canceled)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err, "every node is up")
}

// What the false down mark costs a running job: the keeper's renewals of a
// job on a shard marked down fail at once (extends go through eachTxn
// too), so with a short lease the worker fences itself off and stops a
// healthy run with ErrLeaseExpired, on a cluster whose every node is up.
func TestBreak2FalseDownMarkStopsRunningHandler(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	var slow atomic.Bool
	rdb := cl.Client(t, nil)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slow.Load() && has(cmds, "zrangebyscore", ":ready") {
			<-ctx.Done()
		}
		return nil
	}))
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Lease: time.Second, Logger: quietLog()})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "long"})
	require.NoError(t, err)

	started := make(chan struct{})
	causes := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
			close(started)
			select {
			case <-time.After(3 * time.Second):
				causes <- nil
			case <-hctx.Done():
				causes <- context.Cause(hctx)
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1, Logger: quietLog(), TrimInterval: -1})
	}()
	<-started
	// Elsewhere in the process, a claim with a short deadline on a slow link.
	slow.Store(true)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _ = q.Claim(short, "other")
	cancel()
	slow.Store(false)

	require.NoError(t, <-causes, "a healthy run on a healthy cluster was stopped")
	stop()
	require.NoError(t, <-werr)
}
