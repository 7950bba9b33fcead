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

// A lease the old master granted and lost with it (the replica was stalled
// when the claim was written) leaves the job pending on the promoted
// replica: another worker claims it, and the old holder's lease token is
// refused there, for a renewal and for an outcome.
func TestLeaseLostWithTheMasterIsRefusedOnThePromotedReplica(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 1)
	ctx := context.Background()
	rdb := s.Client(t, func(o *redis.FailoverOptions) { o.DialTimeout = 300 * time.Millisecond })
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Lease: 30 * time.Second, DisableGroupCommit: true})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "j"})
	require.NoError(t, err)
	require.NoError(t, rdb.Wait(ctx, 1, 5*time.Second).Err(), "the pending job is on the replica")

	resumed, err := s.Replicas[0].Stall(2 * time.Second)
	require.NoError(t, err)
	require.NoError(t, s.Master.DropReplicas(ctx))
	old, err := q.Claim(ctx, "old")
	require.NoError(t, err)
	s.Master.Crash() // the claim dies with it: the replica never read it
	<-resumed
	_, _, err = s.WaitPromoted(ctx, s.Master, 20*time.Second)
	require.NoError(t, err)

	var got *Job
	require.Eventually(t, func() bool {
		got, err = q.Get(ctx, "j")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, StatePending, got.State, "the lease was lost with the old master")
	fresh, err := q.Claim(ctx, "new")
	require.NoError(t, err)
	require.Equal(t, "j", fresh.ID)

	_, err = q.Extend(ctx, old)
	require.ErrorIs(t, err, ErrLeaseLost, "the old holder's renewal")
	_, err = q.Complete(ctx, old, []byte("old"))
	require.ErrorIs(t, err, ErrLeaseLost, "the old holder's outcome")
	done, err := q.Complete(ctx, fresh, []byte("new"))
	require.NoError(t, err)
	require.Equal(t, []byte("new"), done.Result)
}

// timeShift adds an offset to every TIME reply a client reads: a master
// whose clock runs ahead of the one that replaces it.
type timeShift struct{ by atomic.Int64 }

func (h *timeShift) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *timeShift) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.shift([]redis.Cmder{cmd})
		return err
	}
}
func (h *timeShift) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.shift(cmds)
		return err
	}
}
func (h *timeShift) shift(cmds []redis.Cmder) {
	for _, c := range cmds {
		if tc, ok := c.(*redis.TimeCmd); ok && tc.Err() == nil {
			tc.SetVal(tc.Val().Add(time.Duration(h.by.Load())))
		}
	}
}

// The estimate of Redis's clock taken from a master an hour ahead does not
// carry over to the master that replaces it: a lease granted or renewed
// after the failover ends Lease after the new master's TIME, read in the
// same round trip, and the estimate follows the new clock from the first
// reply that carries it.
func TestLeaseAfterFailoverEndsByTheNewMastersClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	shift := &timeShift{}
	rdb.AddHook(shift)
	const lease = 10 * time.Second
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Lease: lease, DisableGroupCommit: true})
	require.NoError(t, err)

	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "j"})
	require.NoError(t, err)
	shift.by.Store(int64(time.Hour)) // the old master
	_, err = q.Stats(ctx)
	require.NoError(t, err)
	est, ok := q.clock.Estimate()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(time.Hour), est, 5*time.Second, "the estimate learned the old master's clock")

	shift.by.Store(0) // failed over to a master on time
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	real := time.Now()
	require.WithinDuration(t, real.Add(lease), j.LeaseUntil, 2*time.Second, "the lease ends by the new master's clock")
	est, _ = q.clock.Estimate()
	require.WithinDuration(t, real, est, 2*time.Second, "the estimate follows the new master")
	j, err = q.Extend(ctx, j)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(lease), j.LeaseUntil, 2*time.Second, "a renewal too")
}
