package jobkey

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// BREAK: in a group-commit batch, an Enqueue that repeats the ID of an
// earlier call in the same batch "shares the fate of its first
// occurrence". When the first caller gave up (left out, errLeftOut), the
// repeat, whose caller is still waiting, is answered with errLeftOut too:
// "left out: the caller gave up", for a caller that did not, and nothing
// is written for it although nothing stood in its way.
func TestBreakGroupEnqueueRepeatGetsOtherCallersLeftOut(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	leaderIn, releaseLeader := make(chan struct{}), make(chan struct{})
	var watches atomic.Int32
	var cancelA atomic.Value
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "watch" {
			return nil
		}
		switch watches.Add(1) {
		case 1: // the leader's flush: hold it until A and B queue up
			close(leaderIn)
			<-releaseLeader
		case 2: // the batch [A, B]: A's caller gives up just before the decision
			cancelA.Load().(context.CancelFunc)()
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := context.Background()

	type res struct {
		j   *Job
		err error
	}
	leader := make(chan res, 1)
	go func() { j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "leader"}); leader <- res{j, err} }()
	<-leaderIn
	actx, cancel := context.WithCancel(ctx)
	cancelA.Store(context.CancelFunc(cancel))
	a, b := make(chan res, 1), make(chan res, 1)
	go func() { j, err := q.Enqueue(actx, "t", nil, &EnqueueOpts{ID: "dup"}); a <- res{j, err} }()
	require.Eventually(t, func() bool { q.enqueues.mu.Lock(); defer q.enqueues.mu.Unlock(); return len(q.enqueues.queue) == 1 },
		5*time.Second, time.Millisecond)
	go func() { j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "dup"}); b <- res{j, err} }()
	require.Eventually(t, func() bool { q.enqueues.mu.Lock(); defer q.enqueues.mu.Unlock(); return len(q.enqueues.queue) == 2 },
		5*time.Second, time.Millisecond)
	close(releaseLeader)
	require.NoError(t, (<-leader).err)
	ra, rb := <-a, <-b
	require.ErrorIs(t, ra.err, context.Canceled, "A gave up")
	_, gerr := q.Get(ctx, "dup")
	t.Logf("B, still waiting, got (%v, %v); stored: %v", rb.j, rb.err, gerr)
	require.False(t, errors.Is(rb.err, errLeftOut), "B's caller never gave up, yet was told: %v", rb.err)
	require.NoError(t, rb.err, "nothing stood in the way of B's enqueue")
}
