package jobkey

import (
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestVerifyFindsAndFixesTampering(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, Delay: time.Minute})
		require.NoError(t, err)
	}
	f.clock.Advance(time.Minute)
	c, err := f.q.Claim(f.ctx, "w") // one of them becomes active
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, c)
	require.NoError(t, err)
	rep, err := f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "normal operation leaves nothing to find")
	require.Equal(t, 6, rep.Jobs)

	k := f.q.Keys
	z := func(score float64, id string) redis.Z { return redis.Z{Score: score, Member: id} }
	require.NoError(t, f.rdb.ZRem(f.ctx, k("unlisted").Ready, "unlisted").Err())
	require.NoError(t, f.rdb.ZRem(f.ctx, k("misplaced").Ready, "misplaced").Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("misplaced").Leased, z(1, "misplaced")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("rescored").Ready, z(1, "rescored")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("twice").Failed, z(float64(toMillis(f.clock.Now())), "twice")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("ghost").Ready, z(1, "ghost")).Err())
	require.NoError(t, f.rdb.Set(f.ctx, k("broken").Job, "\xc1", 0).Err())
	values := map[string]string{}
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active", "broken"} {
		values[id] = f.rdb.Get(f.ctx, k(id).Job).Val()
	}

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	got := map[string]string{}
	for _, fd := range rep.Findings {
		got[fd.ID] = fd.Kind
		require.False(t, fd.Fixed)
	}
	require.Equal(t, map[string]string{
		"unlisted": "missing-entry", "misplaced": "wrong-entry", "rescored": "wrong-entry",
		"twice": "wrong-entry", "ghost": "stray-entry", "broken": "missing-entry",
	}, got)

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 6)
	for _, fd := range rep.Findings {
		require.True(t, fd.Fixed, fd.ID)
	}
	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "fix re-derived every entry")
	for id, v := range values {
		require.Equal(t, v, f.rdb.Get(f.ctx, k(id).Job).Val(), "%s: fix never writes a value", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, st.Pending)
	require.EqualValues(t, 1, st.Corrupt)
	var ids []string
	for range 6 {
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	sort.Strings(ids)
	require.Equal(t, []string{"active", "clean", "misplaced", "rescored", "twice", "unlisted"}, ids)
}
