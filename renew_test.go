package jobkey

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Many runs at once share Work's one renewer: each handler outlives
// several lease periods and still finishes under the lease it was given,
// and the runs cost no goroutine of their own beside their slots'.
// (Not parallel: it counts the process's goroutines.)
func TestWorkRenewsManyRunsFromOneKeeper(t *testing.T) {
	redistest.RequireReal(t)
	// A lease of a second: a loaded machine's renewals land well within it.
	const slots, lease = 32, time.Second
	q := queueOn(t, redistest.Client(t, nil), redistest.Prefix(t), Config{Lease: lease})
	ctx := context.Background()
	for i := range slots {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i)})
		require.NoError(t, err)
	}
	release := make(chan struct{})
	var entered atomic.Int32
	var lost atomic.Int32
	h := HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
		entered.Add(1)
		select {
		case <-release:
		case <-hctx.Done():
			lost.Add(1)
			return nil, context.Cause(hctx)
		}
		return []byte("ok"), nil
	})
	before := runtime.NumGoroutine()
	startWork(t, q, h, &WorkOpts{Concurrency: slots})
	waitFor(t, "every slot running", func() bool { return entered.Load() == slots })
	during := runtime.NumGoroutine() - before
	// A slot is a goroutine; Work adds a handful (listener, trimmer,
	// renewer, the pool's and go-redis's). A goroutine per run would add
	// another slots.
	require.Less(t, during, slots+slots/2, "goroutines of Work with %d runs", slots)
	time.Sleep(3 * lease) // renewed some 9 times each meanwhile
	close(release)
	for i := range slots {
		id := fmt.Sprint("j", i)
		waitFor(t, "success of "+id, func() bool { return state(t, q, id) == StateSucceeded })
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, j.Attempt, "no run lost its lease")
	}
	require.Zero(t, lost.Load(), "no handler was stopped")
}

// Renewals that land in Redis but whose replies are lost extend the lease
// unseen: the worker, which counts only renewals it saw confirmed, stops
// its handler first (ErrLeaseExpired), and no other worker claims the job
// before that.
func TestWorkFencesItselfWhenRenewalRepliesAreLost(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	const lease = time.Second
	q := queueOn(t, cut, prefix, Config{Lease: lease})
	rival := queueOn(t, redistest.Client(t, nil), prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := rival.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	started := make(chan struct{})
	stopped := make(chan error, 1)
	var stoppedAt atomic.Int64
	startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(started)
		select {
		case <-ctx.Done():
			stoppedAt.Store(time.Now().UnixNano())
			stopped <- context.Cause(ctx)
		case <-time.After(20 * time.Second):
			stopped <- errors.New("never stopped")
		}
		return nil, ctx.Err()
	}), &WorkOpts{Concurrency: 1})
	<-started
	proxy.Set(faultproxy.Faults{ExecCutProb: 1}) // every renewal runs; no reply comes back
	var claimedAt time.Time
	waitFor(t, "the rival's claim once the lease ran out", func() bool {
		c, err := rival.Claim(ctx, "rival")
		if errors.Is(err, ErrNoJob) {
			return false
		}
		require.NoError(t, err)
		require.Equal(t, j.ID, c.ID)
		claimedAt = time.Now()
		return true
	})
	require.ErrorIs(t, <-stopped, ErrLeaseExpired)
	require.True(t, time.Unix(0, stoppedAt.Load()).Before(claimedAt), "the handler stopped before the rival's claim")
	proxy.Set(faultproxy.Faults{})
}
