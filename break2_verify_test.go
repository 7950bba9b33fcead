package jobkey

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Defect: Verify reads Redis's clock once, at its start, and judges every
// entry whose value is missing by it, in the walk and again in the
// snapshot re-check. An entry of a finished job whose key expires with its
// retention while Verify runs (here the walk reaches the succeeded index
// 1.5s later, as it would on a big queue) is older than the retention by
// then, and is reported as a "stray-entry ... there is no job value": on a
// healthy live queue, roughly one false finding per job whose retention
// ends during the walk.
func TestBreak2VerifyReportsJobsThatExpireDuringTheWalk(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	var slow atomic.Bool
	rdb := redistest.Client(t, nil)
	rdb.AddHook(getHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if a := cmd.Args(); slow.Load() && cmd.Name() == "zrange" && strings.HasSuffix(a[1].(string), ":"+idxSucceeded) {
			time.Sleep(1500 * time.Millisecond) // a big queue: the walk gets here later
		}
		return next(ctx, cmd)
	}))
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Retention: time.Second, Logger: quietLog()})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err)

	slow.Store(true)
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "a job that expired with its retention is not a finding")
}
