package heartbeat

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// A report is live until its TTL runs out by the writer's clock; the next
// write drops the lapsed members, and Leave takes one off at once.
func TestReportsLapseByThemselvesAndLeaveAtOnce(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	p := redistest.Prefix(t)
	set := p + ":{q}:workers"
	now := time.UnixMilli(1_800_000_000_000)
	beat := func(name string, at time.Time) {
		require.NoError(t, Write(ctx, rdb, Beat{Key: p + ":{q}:worker:" + name, Value: []byte(name), TTL: time.Minute, Set: set, Member: name, Now: at}))
	}
	beat("a", now)
	beat("b", now.Add(30*time.Second))
	live, err := Live(ctx, rdb, set, now.Add(59*time.Second))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b"}, live)
	live, err = Live(ctx, rdb, set, now.Add(61*time.Second))
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, live, "a lapsed")
	ttl, err := rdb.PTTL(ctx, p+":{q}:worker:a").Result()
	require.NoError(t, err)
	require.True(t, ttl > 0 && ttl <= time.Minute)

	beat("c", now.Add(61*time.Second))
	all, err := rdb.ZRange(ctx, set, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"b", "c"}, all, "the write dropped a's lapsed member")
	require.NoError(t, Leave(ctx, rdb, set, "b"))
	live, err = Live(ctx, rdb, set, now.Add(61*time.Second))
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, live)
}

// A set of another type fails the write with an error, never in silence.
func TestWriteOverASetOfAnotherTypeFails(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	p := redistest.Prefix(t)
	require.NoError(t, rdb.Set(ctx, p+":{q}:workers", "x", 0).Err())
	err := Write(ctx, rdb, Beat{Key: p + ":{q}:worker:a", Value: []byte("a"), TTL: time.Minute, Set: p + ":{q}:workers", Member: "a", Now: time.Now()})
	require.Error(t, err)
}
