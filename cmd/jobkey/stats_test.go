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
