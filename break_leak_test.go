package jobkey

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// BREAK: a claim flush whose only caller gave up keeps going. claimAlone
// (and claimBatch) consult gone only inside each decision, so after the
// caller is answered the flush still walks every candidate of every round,
// one WATCH round trip each, on a goroutine of its own. At shutdown Work
// returns while that goroutine is still talking to Redis on the caller's
// client (here, on a 2ms network: dozens of round trips after Work returned).
func TestBreakClaimFlushOutlivesWork(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var returned atomic.Bool
	var after atomic.Int32
	inRead := make(chan struct{}, 1)
	var slow, armed atomic.Bool
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if returned.Load() {
			after.Add(1)
		}
		time.Sleep(2 * time.Millisecond) // a network with a 2ms round trip
		if len(cmds) > 0 && cmds[0].Name() == "watch" && armed.Load() && slow.CompareAndSwap(false, true) {
			select {
			case inRead <- struct{}{}:
			default:
			}
			time.Sleep(100 * time.Millisecond) // shutdown begins during the first claim's read
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := context.Background()
	batch := make([]NewJob, 16)
	for i := range batch {
		batch[i] = NewJob{Type: "t"}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	armed.Store(true)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var ran atomic.Int32
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { ran.Add(1); return nil, nil }),
			&WorkOpts{Concurrency: 1, Logger: quiet})
	}()
	<-inRead
	stop()
	require.NoError(t, <-done)
	returned.Store(true)
	time.Sleep(500 * time.Millisecond)
	t.Logf("handler runs: %d; pipelines sent on the queue's client after Work returned: %d", ran.Load(), after.Load())
	require.Zero(t, after.Load(), "Work returned while its claim flush kept talking to Redis")
}
