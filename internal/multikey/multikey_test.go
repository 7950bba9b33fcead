package multikey

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func setup(t *testing.T) (*Queue, *redis.Client, context.Context) {
	t.Helper()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	return New(rdb, redistest.Prefix(t), "q"), rdb, context.Background()
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	q, _, ctx := setup(t)
	_, err := q.Enqueue(ctx, "a", []byte("pa"))
	require.NoError(t, err)
	require.NoError(t, q.EnqueueBatch(ctx, []string{"b", "c"}, [][]byte{[]byte("pb"), []byte("pc")}))
	c, err := q.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, Counts{Pending: 3, Count: 3}, c)

	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, "a", j.ID, "FIFO")
	require.Equal(t, []byte("pa"), j.Payload)
	require.EqualValues(t, 1, j.Attempt)
	require.NoError(t, q.Extend(ctx, j))
	many, err := q.ClaimMany(ctx, "w", 5)
	require.NoError(t, err)
	require.Len(t, many, 2)
	c, err = q.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, Counts{Active: 3, Leases: 3}, c)

	require.NoError(t, q.Complete(ctx, j, []byte("r")))
	require.NoError(t, q.CompleteMany(ctx, many, [][]byte{nil, nil}))
	c, err = q.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, Counts{}, c)
	_, err = q.Claim(ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
}

// The failing group of docs/design.md, section 1: step 2 errors while applying, the
// other two stay applied, and nothing in Redis remembers they belonged
// together.
func TestFailingGroupLeavesPartialState(t *testing.T) {
	t.Parallel()
	q, rdb, ctx := setup(t)
	q.Compensate = false
	require.NoError(t, rdb.Set(ctx, q.PendingKey(), "not a list", 0).Err())

	res, err := q.Enqueue(ctx, "8123", []byte("p"))
	var ge *GroupError
	require.ErrorAs(t, err, &ge)
	require.Equal(t, "multikey: group step failed: [ok, error, ok]", err.Error())
	require.NoError(t, res.Steps[0].Err)
	require.ErrorContains(t, res.Steps[1].Err, "WRONGTYPE")
	require.NoError(t, res.Steps[2].Err)

	require.EqualValues(t, 1, rdb.Exists(ctx, q.JobKey("8123")).Val(), "a record no consumer can see")
	require.Equal(t, "1", rdb.Get(ctx, q.CountKey()).Val(), "a count that includes the invisible job")
	require.Equal(t, "not a list", rdb.Get(ctx, q.PendingKey()).Val(), "pending unchanged")
}

func TestCallerCompensatesFromStepResults(t *testing.T) {
	t.Parallel()
	q, rdb, ctx := setup(t)
	require.NoError(t, rdb.Set(ctx, q.PendingKey(), "not a list", 0).Err())
	res, err := q.Enqueue(ctx, "8123", []byte("p"))
	require.Error(t, err)
	require.NotNil(t, res.Compensation)
	require.Equal(t, "withdraw", res.Compensation.Direction)
	require.NoError(t, res.Compensation.Err)
	require.Zero(t, rdb.Exists(ctx, q.JobKey("8123")).Val(), "record withdrawn")
	require.Equal(t, "0", rdb.Get(ctx, q.CountKey()).Val(), "count re-derived")
}

func TestSweepRepairs(t *testing.T) {
	t.Parallel()
	q, rdb, ctx := setup(t)
	q.Compensate = false
	s := &Sweeper{Q: q}
	// An orphan from a partial enqueue whose caller died before compensating.
	require.NoError(t, rdb.Set(ctx, q.PendingKey(), "x", 0).Err())
	_, err := q.Enqueue(ctx, "orphan", nil)
	require.Error(t, err)
	require.NoError(t, rdb.Del(ctx, q.PendingKey()).Err())
	// A claim whose lease group never ran (the claimer died after the pop).
	_, err = q.Enqueue(ctx, "popped", nil)
	require.NoError(t, err)
	require.NoError(t, rdb.LMove(ctx, q.PendingKey(), q.ActiveKey(), "RIGHT", "LEFT").Err())
	// An expired lease.
	_, err = q.Enqueue(ctx, "expired", nil)
	require.NoError(t, err)
	q.Lease = -time.Second
	_, err = q.Claim(ctx, "w")
	require.NoError(t, err)

	r, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, r.Records)
	require.Equal(t, 1, r.Orphans)
	require.Equal(t, 1, r.ExpiredLeases)
	require.Zero(t, r.ActiveWithoutLease, "a first sighting is only a suspect: its claimer may be mid-way")
	require.EqualValues(t, 2, r.CountDrift, "count 2 (orphan, popped) vs an empty list")

	r, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, r.ActiveWithoutLease)
	c, err := q.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, Counts{Pending: 3, Count: 3}, c, "everything is claimable again")

	q.Lease = time.Minute
	seen := map[string]bool{}
	for {
		j, err := q.Claim(ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		seen[j.ID] = true
	}
	require.Equal(t, map[string]bool{"orphan": true, "popped": true, "expired": true}, seen)
}
