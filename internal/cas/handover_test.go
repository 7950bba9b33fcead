package cas

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// handOnce runs one transaction writing key under a succession whose
// successor offers a read that watches watched, and returns the connection
// the transaction's cache kept afterwards (nil if none).
func handOnce(t *testing.T, e *Engine, key, watched string) *redis.Conn {
	t.Helper()
	ctx, release := WithConnCache(context.Background())
	t.Cleanup(release)
	s := &succession{start: func(h *handover) bool {
		require.True(t, h.offer(h.node, func(ctx context.Context, p redis.Pipeliner) {
			p.Do(ctx, "watch", watched)
			p.Ping(ctx)
		}))
		return true
	}}
	ctx = context.WithValue(ctx, successionKey{}, s)
	_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
		return &Plan{Steps: [][]any{{"set", key + ":x", "v"}}}, nil
	}})
	require.NoError(t, err)
	node, err := e.node(ctx, key)
	require.NoError(t, err)
	return cacheOf(ctx).conns[node]
}

// When the replies after an EXEC that carried a read are lost while the
// EXEC's own came, the EXEC stands and the read behind it is not used; the
// connection, which may still watch the successor's keys, is not kept:
// an unrelated transaction on it later would abort.
func TestAHandOverWhoseTailIsLostKeepsNoWatchingConnection(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	rdb.AddHook(redistest.CarryHook(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
		return redistest.LoseAfterEXEC(cmds, send)
	}))
	prefix := redistest.Prefix(t)
	e := testEngine(t, rdb, 3)
	ctx := context.Background()
	watched := prefix + "watched"
	conn := handOnce(t, e, prefix+"k", watched)
	if conn == nil {
		return // not kept: nothing can go stale
	}
	require.NoError(t, rdb.Set(ctx, watched, "changed", 0).Err())
	_, err := conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Ping(ctx)
		return nil
	})
	require.NoError(t, err, "the kept connection still watched the successor's key")
}

// A hand-over that completes leaves the connection to the successor: the
// transaction that carried its read keeps no reference to it.
func TestAHandOverLeavesTheConnectionToTheSuccessor(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	e := testEngine(t, redistest.Client(t, nil), 3)
	require.Nil(t, handOnce(t, e, prefix+"k", prefix+"watched"))
	require.EqualValues(t, 0, e.Counts().Handovers, "counted by the successor that takes it, not by the one that carried it")
}

// The hand-over may take a while (the successor's batch fills, then its
// read is built): a flush whose callers all gave up meanwhile sends no
// EXEC, and its successor reads on its own.
func TestAFlushThatEndedDuringItsHandOverSendsNoEXEC(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	key, written := prefix+"k", prefix+"k:x"
	cctx, release := WithConnCache(context.Background())
	defer release()
	ctx, cancel := context.WithCancel(cctx)
	var got chan carriedResult
	s := &succession{start: func(h *handover) bool {
		cancel() // every caller gives up while the successor gets ready
		require.True(t, h.offer(h.node, func(ctx context.Context, p redis.Pipeliner) { p.Ping(ctx) }))
		got = h.result
		return true
	}}
	ctx = context.WithValue(ctx, successionKey{}, s)
	_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
		return &Plan{Steps: [][]any{{"set", written, "v"}}}, nil
	}})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, rdb.Exists(context.Background(), written).Val(), "the EXEC was sent after its flush ended")
	select {
	case res := <-got:
		require.Nil(t, res.conn, "the successor reads on its own")
	case <-time.After(5 * time.Second):
		t.Fatal("the successor got no answer")
	}
}
