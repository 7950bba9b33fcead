package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// stats -history prints a row per step, and the rows add up to what the
// queue's jobs did: finishes counted where they finished, scheduled jobs
// where they will run, and jobs due already in no row.
func TestStatsHistoryPrintsFinishesPerStepFromTheIndexes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	for range 3 {
		j := f.claimed("ok", nil)
		_, err := f.q.Complete(f.ctx, j, nil)
		require.NoError(t, err)
	}
	j := f.claimed("bad", nil)
	_, err := f.q.Fail(f.ctx, j, errors.New("boom"))
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "now", nil, nil)
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "later", nil, &jobkey.EnqueueOpts{Delay: 30 * time.Minute})
	require.NoError(t, err)

	out, err := f.run("stats", "-history", "-since", "10m", "-ahead", "1h", "-step", "5m")
	require.NoError(t, err)
	rows := 0
	var sum [4]int
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| 20") {
			continue
		}
		rows++
		var date, clock string
		var n [4]int
		_, err := fmt.Sscanf(line, "| %s %s | %d | %d | %d | %d |", &date, &clock, &n[0], &n[1], &n[2], &n[3])
		require.NoError(t, err, line)
		for i := range n {
			sum[i] += n[i]
		}
	}
	require.True(t, rows == 14 || rows == 15, "70 minutes in rows of 5, from a whole step: %d rows", rows)
	require.Equal(t, [4]int{3, 1, 0, 1}, sum, out)
	require.Contains(t, out, "exact since")

	_, err = f.run("stats", "-history", "-since", "0s")
	require.Error(t, err, "an empty span is refused")
}

// The line that says from when the history is exact says it by the
// retention the queue's workers keep, which Redis does not store: given
// with -retention, a job trimmed after its 1s is older than the exact span,
// and the line names the retention it assumed.
func TestStatsHistorySaysExactSinceByTheWorkersRetention(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, jobkey.Config{Shards: 1, Retention: time.Second})
	j := f.claimed("ok", nil)
	_, err := f.q.Complete(f.ctx, j, nil)
	require.NoError(t, err)
	time.Sleep(2200 * time.Millisecond) // the retention and Trim's second of grace
	n, err := f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the workers' retention has passed")

	out, err := f.run("stats", "-history", "-since", "10m", "-retention", "1s", "-failed-retention", "1m")
	require.NoError(t, err)
	var date, clock string
	i := strings.Index(out, "exact since: succeeded and canceled ")
	require.GreaterOrEqual(t, i, 0, out)
	_, err = fmt.Sscanf(out[i+len("exact since: succeeded and canceled "):], "%s %s", &date, &clock)
	require.NoError(t, err)
	since, err := time.Parse(time.DateTime, date+" "+strings.TrimSuffix(clock, ","))
	require.NoError(t, err)
	require.True(t, !since.Before(j.UpdatedAt.Truncate(time.Second)), "exact since %v, but the job that finished at %v is not counted", since, j.UpdatedAt)
	require.Contains(t, out, "-retention 1s")

	out, err = f.run("stats", "-history", "-since", "10m")
	require.NoError(t, err)
	require.Contains(t, out, "-retention 24h0m0s", "the default it assumes, named")
}
