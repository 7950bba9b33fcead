package jobkey

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: a Queue whose first call had a context that ended (or met Redis
// down) skips the server checks for checkRetry (10s) and lets writes
// through meanwhile: a process configured with the wrong shard count
// writes jobs into shards nobody else reads, and the job is lost to the
// correctly configured processes.
func TestBreak2ShardCheckSkippedAfterFirstCallGaveUp(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	four, err := NewQueue(rdb, "q", &Config{Prefix: prefix, Shards: 4, Logger: quietLog()})
	require.NoError(t, err)
	_, err = four.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	two, err := NewQueue(rdb, "q", &Config{Prefix: prefix, Shards: 2, Logger: quietLog()})
	require.NoError(t, err)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = two.Get(gone, "whatever") // a first call whose caller already gave up
	require.Error(t, err)

	_, err = two.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "misplaced"})
	if err == nil {
		_, gerr := four.Get(ctx, "misplaced")
		t.Fatalf("a Queue with 2 shards enqueued into a 4-shard queue (the 4-shard queue's Get says: %v)", gerr)
	}
	require.ErrorIs(t, err, ErrInvalid)
}

// Same root cause, eviction: a first call that gave up lets writes through
// under allkeys-lru for 10s.
func TestBreak2EvictionCheckSkippedAfterFirstCallGaveUp(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	q, err := NewQueue(rdb, "q", &Config{Logger: quietLog()})
	require.NoError(t, err)
	ctx := context.Background()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = q.Get(gone, "x")
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.ErrorIs(t, err, ErrEvictionPolicy, "writes under allkeys-lru must be refused")
}
