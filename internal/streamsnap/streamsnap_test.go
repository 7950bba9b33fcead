package streamsnap

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// Each stream's info and entries come back together; a missing stream and
// one of another type say so in their own replies, and the others read.
func TestReadGivesEachStreamItsInfoAndEntries(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	p := redistest.Prefix(t)
	full, missing, wrong := p+":{a}:events", p+":{b}:events", p+":{c}:events"
	for i := range 5 {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: full, Values: []any{"n", i}}).Err())
	}
	require.NoError(t, rdb.Set(ctx, wrong, "x", 0).Err())
	for _, sameSlot := range []bool{true, false} {
		got := Read(ctx, rdb, sameSlot, []Range{{full, "-"}, {missing, "-"}, {wrong, "-"}}, 3)
		require.Len(t, got, 3)
		require.NoError(t, got[0].InfoErr)
		require.NoError(t, got[0].Err)
		require.EqualValues(t, 5, got[0].Info.Length)
		require.Len(t, got[0].Msgs, 3)
		require.Equal(t, got[0].Info.FirstEntry.ID, got[0].Msgs[0].ID)
		require.ErrorContains(t, got[1].InfoErr, "no such key")
		require.Empty(t, got[1].Msgs)
		require.ErrorContains(t, got[2].InfoErr, "WRONGTYPE")
	}
}
