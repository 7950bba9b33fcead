package jobkey

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Defect: with more than maxSkip (1000) newer-major jobs ahead of a runnable
// one in an index, the claimer's skip set starts over when it fills, so
// the read window (ClaimWindow + skip set size) never reaches past them:
// the runnable job is never claimed, however often Claim is called.
func TestBreak2ClaimStarvesBehindManyNewerMajorJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Logger: quietLog()})
	b := newerMajorValue(t)
	base := toMillis(f.clock.Now()) - 10_000
	pipe := f.rdb.Pipeline()
	for i := range maxSkip + 100 {
		id := fmt.Sprintf("v2-%05d", i)
		keys := f.q.Keys(id)
		pipe.Set(f.ctx, keys.Job, b, 0)
		pipe.ZAdd(f.ctx, keys.Ready, redis.Z{Score: float64(base + int64(i)), Member: id})
	}
	_, err := pipe.Exec(f.ctx)
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "runnable"})
	require.NoError(t, err)

	for range 8 {
		j, err := f.q.Claim(f.ctx, "old-worker")
		if err == nil {
			require.Equal(t, "runnable", j.ID)
			return
		}
		require.ErrorIs(t, err, ErrNoJob)
	}
	t.Fatalf("a runnable job behind %d newer-format jobs was never claimed (skip set holds %d)", maxSkip+100, f.q.newer.size())
}
