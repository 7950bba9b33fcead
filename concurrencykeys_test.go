package jobkey

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ConcurrencyKeys lists every key Redis holds a value for, each as
// Concurrency reads it, on every shard, and none of another queue.
func TestConcurrencyKeysListsEveryKeyWithAValue(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4, ConcurrencyLimit: 3})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "tenant-a", 2))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "tenant-b", 10, time.Minute))
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "tenant-c"})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	other, err := NewQueue(f.rdb, "other", &Config{Prefix: f.q.cfg.Prefix, Shards: 4})
	require.NoError(t, err)
	require.NoError(t, other.SetConcurrencyLimit(f.ctx, "tenant-z", 1))
	// A value no reader can decode is listed with why, and kept.
	bad := f.q.ks.slotKey(f.q.ks.shardOf("tenant-d"), "tenant-d")
	require.NoError(t, f.rdb.Set(f.ctx, bad, "\xc1junk", 0).Err())

	keys, more, err := f.q.ConcurrencyKeys(f.ctx)
	require.NoError(t, err)
	require.False(t, more)
	var names []string
	for _, k := range keys {
		names = append(names, k.Key)
		if k.Key == "tenant-d" {
			require.Error(t, k.Err)
			continue
		}
		require.NoError(t, k.Err, k.Key)
		want, err := f.q.Concurrency(f.ctx, k.Key)
		require.NoError(t, err)
		require.Equal(t, want, k, "as Concurrency reads %s", k.Key)
	}
	require.Equal(t, []string{"tenant-a", "tenant-b", "tenant-c", "tenant-d"}, names)
	v, err := f.rdb.Get(f.ctx, bad).Result()
	require.NoError(t, err)
	require.Equal(t, "\xc1junk", v)
}

// Keys with glob characters, colons and the text of a key name are
// listed as themselves; a value of the wrong type is listed with why and
// kept; and a queue whose name starts with this one's lends none of its
// keys.
func TestConcurrencyKeysListsOddKeysAndNoneOfAQueueNamedAlike(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	odd := []string{`*`, `?`, `[a-z]`, `\`, `a:b`, `x}:ck:y`[2:], `:ck:`, ` `, "\x00", "é"}
	for _, k := range odd {
		require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, k, 2), "%q", k)
	}
	for _, name := range []string{"q2", "q-", "q*"} {
		other, err := NewQueue(f.rdb, name, &Config{Prefix: f.q.cfg.Prefix, Shards: 4})
		require.NoError(t, err)
		require.NoError(t, other.SetConcurrencyLimit(f.ctx, "theirs", 1))
	}
	wrong := f.q.ks.slotKey(f.q.ks.shardOf("hashed"), "hashed")
	require.NoError(t, f.rdb.HSet(f.ctx, wrong, "f", "v").Err())

	keys, more, err := f.q.ConcurrencyKeys(f.ctx)
	require.NoError(t, err)
	require.False(t, more)
	got := map[string]ConcurrencyInfo{}
	for _, k := range keys {
		got[k.Key] = k
	}
	require.Len(t, got, len(odd)+1, "%v", keys)
	for _, k := range odd {
		require.NoError(t, got[k].Err, "%q", k)
		require.Equal(t, 2, got[k].Limit, "%q", k)
	}
	require.Error(t, got["hashed"].Err)
	typ, err := f.rdb.Type(f.ctx, wrong).Result()
	require.NoError(t, err)
	require.Equal(t, "hash", typ, "kept")
}
