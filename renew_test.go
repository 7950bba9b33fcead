package jobkey

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Many runs at once share Work's one renewer: each handler outlives
// several lease periods and still finishes under the lease it was given,
// and the runs cost no goroutine of their own beside their slots'.
// (Not parallel: it counts the process's goroutines.)
func TestWorkRenewsManyRunsFromOneKeeper(t *testing.T) {
	redistest.RequireReal(t)
	const slots, lease = 32, 450 * time.Millisecond
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
