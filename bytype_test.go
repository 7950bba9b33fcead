package jobkey

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// CountByType counts each type in each state as the values say, each job
// once, on every shard.
func TestCountByTypeCountsEachJobOnceByItsValue(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	want := map[string]*TypeCount{}
	count := func(j *Job) {
		tc := want[j.Type]
		if tc == nil {
			tc = &TypeCount{Type: j.Type}
			want[j.Type] = tc
		}
		switch j.State {
		case StatePending:
			tc.Pending++
		case StateActive:
			tc.Active++
		case StateSucceeded:
			tc.Succeeded++
		case StateFailed:
			tc.Failed++
		case StateCanceled:
			tc.Canceled++
		}
	}
	var ids []string
	for i := range 30 {
		typ := []string{"mail", "sms", "push"}[i%3]
		j, err := f.q.Enqueue(f.ctx, typ, nil, &EnqueueOpts{ID: fmt.Sprintf("j%d", i), MaxAttempts: 1, Priority: i % 2 * 5})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	for i := range 12 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		switch i % 4 {
		case 0:
			_, err = f.q.Complete(f.ctx, c, nil)
		case 1:
			_, err = f.q.Fail(f.ctx, c, errors.New("x"))
		case 2:
			_, err = f.q.Cancel(f.ctx, c.ID)
		}
		require.NoError(t, err)
	}
	for _, id := range ids {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		count(j)
	}
	// An entry the index holds twice over (a stale hint left in ready by a
	// write outside jobkey) is still one job.
	stale := 0
	for _, id := range ids {
		if j, err := f.q.Get(f.ctx, id); err == nil && j.State == StateSucceeded {
			_, s := f.q.ks.jobKeyOf(id)
			require.NoError(t, f.rdb.ZAdd(f.ctx, f.q.ks.index(s, idxReady), redis.Z{Score: 1, Member: id}).Err())
			stale++
		}
	}
	require.Positive(t, stale)

	got, err := f.q.CountByType(f.ctx, 0)
	require.NoError(t, err)
	require.True(t, got.Complete)
	require.EqualValues(t, 30, got.Read)
	require.Len(t, got.Types, 3)
	for _, tc := range got.Types {
		require.Equal(t, *want[tc.Type], tc)
	}

	part, err := f.q.CountByType(f.ctx, 1)
	require.NoError(t, err)
	require.False(t, part.Complete, "one entry per index per shard leaves some out")
	require.Less(t, part.Read, int64(30))
}

// A shard that cannot be read leaves the others' counts, named.
func TestCountByTypeOfTheReadableShards(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	on := [2]int64{}
	for i := range 10 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("k%d", i), Delay: time.Minute})
		require.NoError(t, err)
		_, s := f.q.ks.jobKeyOf(j.ID)
		on[s]++
	}
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(1, idxFailed), "x", 0).Err())
	got, err := f.q.CountByType(f.ctx, 0)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{1}, se.Shards)
	require.Len(t, got.Types, 1)
	require.Equal(t, on[0], got.Types[0].Pending)
}
