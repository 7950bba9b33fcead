package jobkey

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Defect: a trim step is bounded only when the old entries have distinct
// scores. When the first thousand old entries share one millisecond,
// trimStep removes "all of its millisecond" with ZREMRANGEBYSCORE -inf s,
// however many entries that is: here 1,000,000 entries of one score go in
// one command that blocks Redis far past the few milliseconds the docs
// promise for any queue size. (Entries share a score whenever one EXEC
// finishes many jobs, e.g. a CompleteMany, or when a tool loads them.)
func TestBreak2TrimOfOneMillisecondIsUnbounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--slowlog-log-slower-than", "5000", "--slowlog-max-len", "1000"}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "big", &Config{Retention: time.Hour, Logger: quietLog()})
	require.NoError(t, err)
	key := q.Keys("any").Succeeded
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	const n = 1_000_000
	load := `for i = 0, tonumber(ARGV[1]) - 1, 200 do
		local args = {}
		for k = 0, 199 do
			args[#args+1] = tonumber(ARGV[2])
			args[#args+1] = 'expired-' .. (i + k + tonumber(ARGV[3]))
		end
		redis.call('zadd', KEYS[1], unpack(args))
	end
	return 1`
	for start := 0; start < n; start += 100_000 {
		require.NoError(t, rdb.Eval(ctx, load, []string{key}, 100_000, old, start).Err())
	}
	require.EqualValues(t, n, rdb.ZCard(ctx, key).Val())
	require.NoError(t, rdb.SlowLogReset(ctx).Err())

	got, err := q.Trim(ctx)
	require.NoError(t, err)
	t.Logf("one Trim removed %d entries", got)

	slow, err := rdb.SlowLogGet(ctx, 1000).Result()
	require.NoError(t, err)
	for _, s := range slow {
		if strings.ToLower(fmt.Sprint(s.Args[0])) == "zremrangebyscore" {
			t.Errorf("a trim step blocked Redis for %v: %v", s.Duration, s.Args)
		}
	}
}
