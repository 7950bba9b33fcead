package jobkey

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: runChecks records a shard-count mismatch in shardsErr, then
// reads INFO; when INFO fails with anything but NOPERM (here the command
// is renamed away, as hardened deployments do; also a timeout), it returns
// that error, check treats it as "Redis cannot be reached", and lets the
// call through, ignoring the mismatch it had just found. It does so again
// every 10s, forever: a process with the wrong shard count writes jobs
// where no other process looks.
func TestBreak2ShardMismatchIgnoredWhenInfoFails(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--rename-command", "INFO", ""}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	four, err := NewQueue(rdb, "q", &Config{Shards: 4, Logger: quietLog()})
	require.NoError(t, err)
	_, err = four.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	two, err := NewQueue(rdb, "q", &Config{Shards: 2, Logger: quietLog()})
	require.NoError(t, err)
	_, err = two.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "misplaced"})
	require.ErrorIs(t, err, ErrInvalid, "the stored count is 4; a Queue of 2 shards must be refused")
}
