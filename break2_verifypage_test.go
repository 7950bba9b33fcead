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

// Defect: Verify pages through an index by rank (ZRANGE key start
// start+999). On a live queue, entries of earlier pages leave the index
// between two pages (claims take them), everything after moves down, and
// the next page starts past entries it never read: Verify silently skips
// them. Here five claims between the first and second page of ready hide
// a hand-made wrong entry at rank 1000; Verify reports a clean queue.
func TestBreak2VerifySkipsEntriesWhenEarlierPagesShrink(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Logger: quietLog()})
	require.NoError(t, err)
	batch := make([]JobSpec, verifyPage)
	for i := range batch {
		batch[i] = JobSpec{Type: "t"}
	}
	_, err = q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	// A job that finished, whose ID someone also put back in ready by hand,
	// due later than the others: rank 1000 of ready.
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "tampered", Delay: time.Hour})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, "tampered")
	require.NoError(t, err)
	require.NoError(t, rdb.ZAdd(ctx, q.Keys("tampered").Ready, redis.Z{Score: float64(time.Now().Add(2 * time.Hour).UnixMilli()), Member: "tampered"}).Err())
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1, "found on a quiet queue")

	var pages atomic.Int64
	rdb.AddHook(getHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "zrange" && strings.HasSuffix(a[1].(string), ":"+idxReady) && pages.Add(1) == 1 {
			for range 5 { // workers claim while Verify reads the first page
				_, cerr := q.Claim(ctx, "w")
				require.NoError(t, cerr)
			}
		}
		return err
	}))
	rep, err = q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1, "the wrong entry is still there, but Verify read past it (%d entries read)", rep.Entries)
}
