package jobkey

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// skewedQueue is a queue on the shared real Redis whose host clock runs
// skew away from the truth. Nothing fakes Redis's clock here.
func skewedQueue(t *testing.T, prefix string, skew time.Duration, cfg Config) *Queue {
	t.Helper()
	cfg.Prefix = prefix
	cfg.Now = func() time.Time { return time.Now().Add(skew) }
	q, err := NewQueue(redistest.Client(t, nil), "q", &cfg)
	require.NoError(t, err)
	return q
}

// A claimer whose clock runs 30 s ahead does not take a lease granted a
// moment ago, and one 10 s ahead does not run a scheduled job early: both
// are judged by Redis's clock.
func TestClockSkewClaimsByRedisTime(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	honest := skewedQueue(t, prefix, 0, Config{Lease: 5 * time.Second})
	ahead30 := skewedQueue(t, prefix, 30*time.Second, Config{Lease: 5 * time.Second})
	ahead10 := skewedQueue(t, prefix, 10*time.Second, Config{Lease: 5 * time.Second})

	j, err := honest.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	c, err := honest.Claim(ctx, "honest")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	_, err = ahead30.Claim(ctx, "ahead")
	require.ErrorIs(t, err, ErrNoJob, "a lease granted a moment ago has 5 s left, whatever the claimer's clock says")
	got, err := honest.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, "honest", got.LeaseOwner)

	_, err = honest.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "later", Delay: 3 * time.Second})
	require.NoError(t, err)
	_, err = ahead10.Claim(ctx, "ahead")
	require.ErrorIs(t, err, ErrNoJob, "a job due in 3 s is not run early by a clock 10 s ahead")
}

// A producer whose clock runs ahead enqueues jobs due now by Redis's
// clock, and a claimer whose clock runs behind still sees them due.
func TestClockSkewEnqueueByRedisTime(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	ahead := skewedQueue(t, prefix, 10*time.Second, Config{})
	behind := skewedQueue(t, prefix, -10*time.Second, Config{})

	server, err := redistest.Client(t, nil).Time(ctx).Result()
	require.NoError(t, err)
	j, err := ahead.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	require.WithinDuration(t, server, j.RunAt, 2*time.Second, "RunAt is Redis's now, not the producer's")
	require.WithinDuration(t, server, j.CreatedAt, 2*time.Second)
	d, err := ahead.Enqueue(ctx, "t", nil, &EnqueueOpts{Delay: time.Minute})
	require.NoError(t, err)
	require.WithinDuration(t, server.Add(time.Minute), d.RunAt, 2*time.Second, "Delay counts from Redis's now")

	c, err := behind.Claim(ctx, "behind")
	require.NoError(t, err, "a clock 10 s behind still finds the job due")
	require.Equal(t, j.ID, c.ID)
	require.WithinDuration(t, server.Add(30*time.Second), c.LeaseUntil, 2*time.Second, "the lease ends 30 s after Redis's now")

	st, err := behind.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Pending: 1, Scheduled: 1, Active: 1}, st, "Stats judges due and expired by Redis's clock too")
}

// A Queue that reads before it ever wrote asks Redis for TIME once.
func TestClockFirstEstimateAsksRedis(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	q := skewedQueue(t, redistest.Prefix(t), time.Hour, Config{})
	_, known := q.clock.Estimate()
	require.False(t, known)
	now, err := q.clock.Now(ctx, q.rdb)
	require.NoError(t, err)
	server, err := q.rdb.(*redis.Client).Time(ctx).Result()
	require.NoError(t, err)
	require.WithinDuration(t, server, now, time.Second)
	_, known = q.clock.Estimate()
	require.True(t, known)
}
