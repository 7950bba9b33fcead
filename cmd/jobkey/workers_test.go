package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// startWork runs Work on the fixture's queue until the test ends.
func (f *fixture) startWork(h jobkey.Handler, o *jobkey.WorkOpts) {
	f.t.Helper()
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.q.Work(ctx, h, o) }()
	f.t.Cleanup(func() {
		stop()
		require.NoError(f.t, <-done)
	})
}

// workers and schedules print what the running Works report: their runs,
// and each schedule with its next tick and its last tick's job and state.
func TestWorkersAndSchedulesPrintTheRunningWorks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	release := make(chan struct{})
	f.startWork(jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		if j.Type == "block" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, nil
	}), &jobkey.WorkOpts{Name: "evil|name\x1b[31m", Concurrency: 2, PollInterval: 20 * time.Millisecond,
		Periodic: []jobkey.PeriodicJob{{Name: "hourly", Schedule: jobkey.Every(time.Hour), Type: "report", StartWithLatestTick: true}}})
	t.Cleanup(func() { close(release) }) // before Work is stopped
	j, err := f.q.Enqueue(f.ctx, "block", nil, nil)
	require.NoError(t, err)

	var out string
	require.Eventually(t, func() bool {
		out, err = f.run("workers")
		require.NoError(t, err)
		return strings.Contains(out, j.ID)
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, out, `| evil\|name\x1b[31m |`, "the name is one cell, and inert")
	require.NotContains(t, out, "\x1b")
	require.Contains(t, out, "| 1/2 |")
	require.Contains(t, out, j.ID+" (block, attempt 1, ")

	last := time.Now().UTC().Truncate(time.Hour)
	require.Eventually(t, func() bool {
		out, err = f.run("schedules")
		require.NoError(t, err)
		return strings.Contains(out, "| succeeded |")
	}, 10*time.Second, 20*time.Millisecond, "the latest tick's job ran")
	require.Contains(t, out, "| hourly | every 1h0m0s | report | "+last.Add(time.Hour).Format(time.DateTime)+" | "+last.Format(time.DateTime)+" | periodic:hourly:")

	out, err = f.run("schedules", "-json")
	require.NoError(t, err)
	var doc struct {
		Schedules []scheduleView `json:"schedules"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc.Schedules, 1)
	require.Equal(t, []string{"evil|name\x1b[31m"}, doc.Schedules[0].KeptBy)
	require.Equal(t, "succeeded", doc.Schedules[0].LastJobState)
}

func TestWorkersSaysWhenNoneReported(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.enqueue("t", nil) // the queue exists
	out, err := f.run("workers")
	require.NoError(t, err)
	require.Contains(t, out, "no worker of queue \"mail\" has reported itself")
	out, err = f.run("schedules")
	require.NoError(t, err)
	require.Contains(t, out, "no running worker")
}

// A report's schedule whose last job cannot be read prints that job's
// error as one inert cell: a forged report (or a hostile schedule name)
// sends nothing to the terminal.
func TestSchedulesPrintsAnUnreadableLastJobInert(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.enqueue("t", nil) // the queue exists
	id := "tick\x1b[31m|x\nline"
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(id).Job, "\xc1\x1b[2J not a job", 0).Err())
	report, err := json.Marshal(map[string]any{"v": 1, "name": "w", "schedules": []map[string]any{
		{"name": "s", "spec": "every 1h0m0s", "type": "t", "last_job_id": id, "last_tick": time.Now().UTC()}}})
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, f.prefix+":{mail}:worker:w", report, time.Minute).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, f.prefix+":{mail}:workers", redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "w"}).Err())

	out, err := f.run("schedules")
	require.NoError(t, err)
	require.NotContains(t, out, "\x1b")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, rows, 3, "a header, its rule and one row:\n%s", out)
	require.Equal(t, 9, strings.Count(rows[2], "|")-strings.Count(rows[2], `\|`), "eight cells: %s", rows[2])
}

// On a cluster with a master down, limit with no key prints the live
// masters' keys and names the shards it left out, and exits non-zero.
func TestLimitListsTheLiveMastersKeysWhenOneIsDead(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	rdb := cl.Client(t, nil)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	q, err := jobkey.NewQueue(rdb, "mail", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	node := func(key string) string {
		m, err := rdb.MasterForKey(ctx, key)
		require.NoError(t, err)
		return m.Options().Addr
	}
	for i := range 40 {
		require.NoError(t, q.SetConcurrencyLimit(ctx, "tenant-"+strconv.Itoa(i), 2))
	}
	meta := node(prefix + ":{mail}:meta")
	var dead *redistest.Server
	for _, n := range cl.Nodes {
		if n.Addr != meta {
			dead = n
			break
		}
	}
	var live []string
	for i := range 40 {
		k := "tenant-" + strconv.Itoa(i)
		id, err := q.IDFor(k, "x")
		require.NoError(t, err)
		if node(q.Keys(id).Job) != dead.Addr {
			live = append(live, k)
		}
	}
	require.Less(t, len(live), 40, "the dead master holds some keys")
	dead.Stop()

	var out, errOut bytes.Buffer
	err = run(ctx, []string{"limit", "-redis", "redis://" + meta, "-queue", "mail", "-prefix", prefix}, &out, &errOut)
	require.ErrorIs(t, err, errPartial, errOut.String())
	for _, k := range live {
		require.Contains(t, out.String(), "| "+k+" | 2 |")
	}
	require.Contains(t, out.String(), "shards could not be read")
}
