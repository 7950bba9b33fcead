package jobkey

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: a meta key of another type (a hash here) makes SET NX GET fail
// with WRONGTYPE; check reports it as "could not check the server; trying
// again later" and lets every call through, so the shard-count guard is
// off for good, where every other key of the wrong type is refused with a
// *WrongTypeError naming it.
func TestBreak2MetaKeyOfWrongTypeDisablesTheShardCheck(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	q, err := NewQueue(rdb, "q", &Config{Prefix: prefix, Shards: 2, Logger: quietLog()})
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, q.ks.metaKey(), "shards", "4").Err())
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.ErrorIs(t, err, ErrWrongType, "the meta key holds a hash")
}
