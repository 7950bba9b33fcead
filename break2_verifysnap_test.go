package jobkey

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Defect: Verify re-checks up to 100 suspects in one read-only MULTI/EXEC
// that GETs each suspect's whole value. EXEC runs atomically, and its
// batch is bounded in jobs, not bytes: with values near the default
// MaxValueBytes (1 MiB), the one EXEC copies ~100 MiB of replies while
// every other client waits, far past the "few milliseconds at any queue
// size" the docs promise. SLOWLOG does not show it (Redis leaves EXEC out
// of SLOWLOG and logs the inner GETs one by one), so it is measured here
// as the EXEC's own time in INFO commandstats.
func TestBreak2VerifySnapshotOfLargeValuesBlocksRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "big", &Config{Logger: quietLog()})
	require.NoError(t, err)
	payload := bytes.Repeat([]byte{'x'}, 1<<20-512)
	for i := range 100 {
		id := fmt.Sprintf("j%03d", i)
		_, err := q.Enqueue(ctx, "t", payload, &EnqueueOpts{ID: id})
		require.NoError(t, err)
		// Someone edited the entry's score by hand: a suspect, re-checked in the snapshot.
		require.NoError(t, rdb.ZAdd(ctx, q.Keys(id).Ready, redis.Z{Score: 1, Member: id}).Err())
	}
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 100)
	var execTime time.Duration
	for line := range strings.Lines(rdb.Info(ctx, "commandstats").Val()) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_exec:"); ok {
			t.Logf("Verify's EXECs: %s", rest)
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					us, _ := strconv.Atoi(v)
					execTime = time.Duration(us) * time.Microsecond
				}
			}
		}
	}
	require.Less(t, execTime, 20*time.Millisecond, "Verify's snapshot held Redis for %v in one EXEC", execTime)
}
