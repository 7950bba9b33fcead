package jobkey

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestCRC16MatchesRedis(t *testing.T) {
	t.Parallel()
	// Reference values from the Redis Cluster specification and CLUSTER KEYSLOT.
	require.EqualValues(t, 0x31C3, crc16("123456789"))
	require.Equal(t, 12182, int(crc16("foo"))%hashSlots)
	require.Equal(t, 5061, int(crc16("bar"))%hashSlots)
}

func TestShardTagsSpreadOverTheSlotRange(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3, 16, 100, 1024} {
		part := hashSlots / n
		for i := range n {
			slot := int(crc16(shardTag("emails", i, n))) % hashSlots
			require.GreaterOrEqual(t, slot, i*hashSlots/n+part/4, "n=%d i=%d", n, i)
			require.Less(t, slot, i*hashSlots/n+part/4+max(1, part/2), "n=%d i=%d", n, i)
		}
	}
	require.Equal(t, "emails/0", shardTag("emails", 0, 1))
}

// idForQueue is a queue of shards shards, for IDFor, which reads no Redis.
func idForQueue(t *testing.T, shards int) *Queue {
	t.Helper()
	q := queueOn(t, redistest.Client(t, nil), redistest.Prefix(t), Config{Shards: shards, Logger: quietLog()})
	return q
}

// trickyBases are every string of up to 6 bytes over "a", "~", "0" and
// "1": bases that hold the separator, end in "~<digits>", are already
// what IDFor makes of a shorter base, or land in the key's shard.
func trickyBases() []string {
	out := []string{}
	level := []string{""}
	for range 6 {
		var next []string
		for _, b := range level {
			for _, c := range []string{"a", "~", "0", "1"} {
				next = append(next, b+c)
			}
		}
		out = append(out, next...)
		level = next
	}
	out = append(out, "order-0", "order-0~1", "order-0~2", "order-0~3", "order-0~3~1", "x~01", "x~1a")
	slices.Sort(out)
	return slices.Compact(out)
}

// Over every tricky base, for keys of several shards: distinct bases give
// distinct IDs, each one valid, in its key's shard, and the same every time.
func TestIDForDistinctBasesGiveDistinctIDs(t *testing.T) {
	t.Parallel()
	bases := trickyBases()
	for _, shards := range []int{2, 4, 16} {
		q := idForQueue(t, shards)
		for _, key := range []string{"cust", "k2", "tenant-a", "~"} {
			from := make(map[string]string, len(bases))
			for _, base := range bases {
				id, err := q.IDFor(key, base)
				require.NoError(t, err, "base %q", base)
				require.NoError(t, validID(id))
				require.Equal(t, q.ks.shardOf(key), q.ks.shardOf(id), "base %q gives %q", base, id)
				if prev, ok := from[id]; ok {
					require.Failf(t, "IDFor is not injective", "%d shards, key %q: bases %q and %q both give %q", shards, key, prev, base, id)
				}
				from[id] = base
				again, err := q.IDFor(key, base)
				require.NoError(t, err)
				require.Equal(t, id, again)
			}
		}
	}
}

// The same, for random bases over a small alphabet, so that separators,
// digits and what IDFor makes of other bases come up often.
func TestIDForInjectiveProperty(t *testing.T) {
	t.Parallel()
	q := idForQueue(t, 8)
	base := rapid.StringOfN(rapid.SampledFrom([]rune{'a', '~', '0', '1', '9'}), 1, 12, -1)
	rapid.Check(t, func(rt *rapid.T) {
		key := rapid.SampledFrom([]string{"a", "b", "c~1"}).Draw(rt, "key")
		b1, b2 := base.Draw(rt, "b1"), base.Draw(rt, "b2")
		id1, err := q.IDFor(key, b1)
		require.NoError(rt, err)
		// What IDFor made of b1, used as a base in turn, or another base.
		b2 = rapid.SampledFrom([]string{b2, id1, id1 + "~1", b1 + "~1"}).Draw(rt, "second base")
		id2, err := q.IDFor(key, b2)
		require.NoError(rt, err)
		if b1 != b2 {
			require.NotEqual(rt, id1, id2, "bases %q and %q", b1, b2)
		}
	})
}

// A base made by appending "~<n>" to another base no longer collides with
// what IDFor made of that base: both jobs are enqueued, none is refused as
// one that exists.
func TestIDForSuffixedBaseGetsItsOwnID(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 8})
	key := "cust"
	for k := 0; f.q.ks.shardOf(key) == f.q.ks.shardOf("order-0"); k++ {
		key = fmt.Sprintf("cust-%d", k)
	}
	first, err := f.q.IDFor(key, "order-0")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "order-0~"), "order-0 is outside the key's shard: %q", first)
	// first ends in "~<n>" and lies in the key's shard: as a base of its
	// own, it must still give another ID.
	second, err := f.q.IDFor(key, first)
	require.NoError(t, err)
	require.NotEqual(t, first, second, "IDFor(%q, %q) and IDFor(%q, %q)", key, "order-0", key, first)
	for _, id := range []string{first, second} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: key})
		require.NoError(t, err, "job %q", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Pending)
}

// A base IDFor cannot place within MaxIDLen is refused with ErrInvalid;
// every ID it returns, at any base length, is one Enqueue accepts.
func TestIDForReturnsOnlyIDsEnqueueAccepts(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 8})
	const key = "cust"
	refused := 0
	for n := MaxIDLen - 12; n <= MaxIDLen; n++ {
		for _, c := range []string{"a", "b", "c"} {
			base := strings.Repeat(c, n)
			id, err := f.q.IDFor(key, base)
			if err != nil {
				require.ErrorIs(t, err, ErrInvalid, "base of %d bytes", n)
				refused++
				continue
			}
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: key})
			require.NoError(t, err, "IDFor gave %d bytes for a base of %d", len(id), n)
		}
	}
	require.Positive(t, refused, "bases at MaxIDLen outside the key's shard have no room for a suffix")
	for _, bad := range []struct{ key, base string }{{key, ""}, {key, "a{b}"}, {key, strings.Repeat("x", MaxIDLen+1)}, {"k{1}", "a"}} {
		_, err := f.q.IDFor(bad.key, bad.base)
		require.ErrorIs(t, err, ErrInvalid, "key %q, base %q", bad.key, bad.base)
	}
}

func TestKeySlotFollowsTheClusterHashTagRule(t *testing.T) {
	t.Parallel()
	// CLUSTER KEYSLOT on Redis 7.0: a key's slot is its first non-empty
	// hash tag's, else the whole key's.
	require.Equal(t, 12182, hashSlot("foo"))
	require.Equal(t, 12182, hashSlot("{foo}:bar"))
	require.Equal(t, 12182, hashSlot("x:{foo}:{bar}"))
	require.Equal(t, int(crc16("{}foo"))%hashSlots, hashSlot("{}foo"))
	require.Equal(t, int(crc16("x{foo"))%hashSlots, hashSlot("x{foo"))
}
