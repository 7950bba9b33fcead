package jobkey

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: an idle worker of this build busy-polls Redis while a job in a
// newer major format sits at the head of an index. untilDue reads the
// first entry of ready (ZRANGE 0 0), which is the newer job the claimer
// skips, so it says "due now", the slot waits max(1ms, 0) and claims again:
// about a thousand claim reads a second per slot, although the doc says
// idle workers do not busy-poll (they wait PollInterval, here 1s).
func TestBreak2OldWorkerBusyPollsBehindNewerMajorJob(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb, hook := hooked(t, 0)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Logger: quietLog()})
	require.NoError(t, err)
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	plantNewer(t, ctx, rdb, q, "from-v2", now.UnixMilli(), newerMajorValue(t))

	wctx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	hook.Reset()
	require.NoError(t, q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: 1, PollInterval: time.Second, TrimInterval: -1}))
	rtt := hook.RTT.Load()
	t.Logf("one idle slot made %d round trips in 2s (PollInterval 1s)", rtt)
	require.Less(t, rtt, int64(40), "an idle worker must not busy-poll a queue holding only a job it cannot read")
}
