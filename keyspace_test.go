package jobkey

import (
	"hash/fnv"
	"testing"

	"github.com/stretchr/testify/require"
)

// A job's shard must never change: the hash is hash/fnv's FNV-1a, byte for
// byte.
func FuzzShardHashIsFNV1a(f *testing.F) {
	for _, s := range []string{"", "a", "01JABCDEFGHJKMNPQRSTVWXYZ0", "job:é\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := fnv.New32a()
		_, _ = h.Write([]byte(s))
		require.Equal(t, h.Sum32(), fnv32a(s))
	})
}

// Index keys built ahead are the keys built on demand.
func TestIndexKeysBuiltAheadMatchTheKeyspace(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("p", "q", 3)
	for shard := range 3 {
		for _, name := range append(indexNames, "other") {
			require.Equal(t, ks.tags[shard]+":"+name, ks.index(shard, name))
		}
	}
}
