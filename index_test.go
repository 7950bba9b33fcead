package jobkey

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWrongTypeIndexRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ready := f.q.ks.index(0, idxReady)
	require.NoError(t, f.rdb.Set(f.ctx, ready, "not a zset", 0).Err())
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, ready, wt.Key)
	_, err = f.q.Get(f.ctx, "x")
	require.ErrorIs(t, err, ErrNotFound, "nothing was written")
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorAs(t, err, &wt)
	require.Equal(t, ready, wt.Key)
}

// The fault of the failing group (docs/design.md, section 1), injected into jobkey: the
// index the enqueue writes holds a string. Nothing is written, the error
// names the key, and the other shards' jobs keep flowing.
func TestInjectedFaultWritesNothingOthersFlow(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	id := "8123"
	key, shard := f.q.ks.jobKeyOf(id)
	broken := f.q.ks.index(shard, idxReady)
	require.NoError(t, f.rdb.Set(f.ctx, broken, "not a zset", 0).Err())

	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, broken, wt.Key)
	require.Zero(t, f.rdb.Exists(f.ctx, key).Val(), "no record")
	require.Equal(t, "not a zset", f.rdb.Get(f.ctx, broken).Val())

	flowed := 0
	for i := 0; flowed < 10; i++ {
		other := fmt.Sprintf("job-%d", i)
		if _, s := f.q.ks.jobKeyOf(other); s == shard {
			continue
		}
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: other})
		require.NoError(t, err)
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
		flowed++
	}
	_, err = f.q.Stats(f.ctx)
	require.ErrorAs(t, err, &wt, "Stats reports the broken index rather than a wrong count")
	require.Equal(t, broken, wt.Key)
}

// An index plan merges the writes of every job into one ZREM and one ZADD
// per key, removals first, keys in first-use order and members in the
// order written; a rescore replaces the score of an addition it holds.
func TestIndexPlanStepsMergePerKey(t *testing.T) {
	t.Parallel()
	var p indexPlan
	p.zadd("leased", 5000, "a")
	p.zrem("ready", "a")
	p.zadd("leased", 5000, "b")
	p.zrem("ready", "b")
	p.zadd("succeeded", 7, "c")
	p.zrem("leased", "c")
	p.rescore("leased", 6000, "b")
	p.rescore("ready", 1, "d")
	p.flag("flag")
	steps := p.steps()
	require.Equal(t, [][]any{
		{"zrem", "leased", "c"},
		{"zrem", "ready", "a", "b"},
		{"zadd", "leased", int64(5000), "a", int64(6000), "b"},
		{"zadd", "ready", int64(1), "d"},
		{"zadd", "succeeded", int64(7), "c"},
		{"set", "flag", "1"},
	}, steps)
	require.Equal(t, []typeCheck{{Key: "leased", Want: "zset"}, {Key: "ready", Want: "zset"}, {Key: "succeeded", Want: "zset"}, {Key: "flag", Want: "string"}}, p.checks)
	for _, s := range steps {
		require.Equal(t, len(s), cap(s), "a step must not append into the next one's arguments")
	}
	var empty indexPlan
	require.Empty(t, empty.steps())
}
