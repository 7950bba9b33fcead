package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: `jobkey verify` opens the queue with the default Retention (24h),
// whatever the queue's processes use: the meta key stores only the shard
// count. On a queue whose jobs are retained 1s, the index entry of a
// finished job whose key has expired and which no trim has removed yet
// (Work trims once a minute; a queue without Work never) is not older than
// 24h, so verify reports it as a "stray-entry ... there is no job value"
// and exits non-zero on a queue with nothing wrong. (stats likewise counts
// such expired jobs as succeeded for 24h.)
func TestBreak2VerifyJudgesExpiredJobsByDefaultRetention(t *testing.T) {
	url := redistest.RequireReal(t).URL
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mail", &jobkey.Config{Prefix: prefix, Retention: time.Second})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rdb.Exists(ctx, q.Keys(j.ID).Job).Val() == 0 },
		5*time.Second, 50*time.Millisecond, "the finished job expires with its retention")
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "the library, with the queue's retention, finds nothing")

	var out, errOut bytes.Buffer
	err = run(ctx, []string{"verify", "-redis", url, "-queue", "mail", "-prefix", prefix}, &out, &errOut)
	require.NoError(t, err, "verify of a healthy queue must exit 0:\n%s", out.String())
}
