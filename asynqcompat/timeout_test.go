package asynqcompat

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// asynq.Timeout(d) becomes the jobkey job's Timeout, whether given to
// Enqueue or to NewTask; the last one wins and Timeout(0) is none, as in
// asynq; what jobkey cannot hold is refused and nothing is enqueued.
func TestClientMapsTimeout(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	c := NewClient(nil, []Route{{Type: moveType, To: q}})
	for _, tc := range []struct {
		id   string
		task []asynq.Option
		opts []asynq.Option
		want time.Duration
	}{
		{id: "none", want: 0},
		{id: "90s", opts: []asynq.Option{asynq.Timeout(90 * time.Second)}, want: 90 * time.Second},
		{id: "on-task", task: []asynq.Option{asynq.Timeout(time.Minute)}, want: time.Minute},
		{id: "enqueue-wins", task: []asynq.Option{asynq.Timeout(time.Minute)}, opts: []asynq.Option{asynq.Timeout(2 * time.Minute)}, want: 2 * time.Minute},
		{id: "zero-last", opts: []asynq.Option{asynq.Timeout(time.Minute), asynq.Timeout(0)}, want: 0},
		{id: "sub-second", opts: []asynq.Option{asynq.Timeout(1500 * time.Millisecond)}, want: 1500 * time.Millisecond},
		{id: "sub-milli", opts: []asynq.Option{asynq.Timeout(1500 * time.Microsecond)}, want: 2 * time.Millisecond},
		{id: "max", opts: []asynq.Option{asynq.Timeout(jobkey.MaxTimeout)}, want: jobkey.MaxTimeout},
	} {
		info, err := c.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(tc.id), tc.task...), append(tc.opts, asynq.TaskID(tc.id))...)
		require.NoError(t, err, tc.id)
		require.Equal(t, tc.want, info.Timeout, tc.id)
		j, err := q.Get(e.ctx, tc.id)
		require.NoError(t, err, tc.id)
		require.Equal(t, tc.want, j.Timeout, "%s: the stored job's Timeout", tc.id)
	}

	for _, o := range []asynq.Option{asynq.Timeout(-time.Second), asynq.Timeout(jobkey.MaxTimeout + time.Millisecond)} {
		_, err := c.Enqueue(asynq.NewTask(moveType, nil), asynq.TaskID("refused"), o)
		var oe *OptionError
		require.ErrorAs(t, err, &oe, o.String())
		require.ErrorIs(t, err, ErrUnsupportedOption)
		require.Equal(t, o.String(), oe.Option)
		_, err = c.Enqueue(asynq.NewTask(moveType, nil, o), asynq.TaskID("refused"))
		require.ErrorIs(t, err, ErrUnsupportedOption, "given to NewTask: %s", o)
	}
	_, err := q.Get(e.ctx, "refused")
	require.ErrorIs(t, err, jobkey.ErrNotFound, "nothing was enqueued")
}

// An unchanged asynq handler run by Work sees its context end at the
// Timeout given through the Client, with ctx.Err() DeadlineExceeded as in
// asynq; the attempt fails with a timeout, and so does one whose handler
// returns nil after the timeout passed, as asynq's server fails it.
func TestHandlerTimeout(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "h", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	c := NewClient(nil, []Route{{Type: moveType, To: q}})
	for _, id := range []string{"watches-ctx", "ignores-ctx", "fast"} {
		_, err := c.Enqueue(asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id), asynq.Timeout(150*time.Millisecond), asynq.MaxRetry(1))
		require.NoError(t, err)
	}
	var mu sync.Mutex
	errs, causes := map[string]error{}, map[string]error{}
	ran := map[string][]time.Duration{}
	// For each run of watches-ctx: how long before the handler began its
	// deadline lay, and whether its ctx ended before that deadline.
	budgets, early := []time.Duration{}, 0
	h := HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, start := string(task.Payload()), time.Now()
		dl, _ := ctx.Deadline()
		switch id {
		case "watches-ctx":
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		case "ignores-ctx":
			time.Sleep(400 * time.Millisecond)
		}
		mu.Lock()
		errs[id], causes[id] = ctx.Err(), context.Cause(ctx)
		ran[id] = append(ran[id], time.Since(start))
		if id == "watches-ctx" {
			budgets = append(budgets, dl.Sub(start))
			if time.Now().Before(dl) {
				early++
			}
		}
		mu.Unlock()
		if id == "watches-ctx" {
			return ctx.Err()
		}
		return nil
	})
	// The first adapted run checks asynq's layouts once (asynqtask.go); on
	// a loaded machine that takes a share of the timeout before the
	// handler starts, so it is done before the runs are timed.
	loadInternals()
	jobs := work(t, e, q, h, "watches-ctx", "ignores-ctx", "fast")

	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"watches-ctx", "ignores-ctx"} {
		j := jobs[id]
		require.Equal(t, jobkey.StateFailed, j.State, id)
		require.Equal(t, 2, j.Attempt, "%s: retried once (MaxRetry(1)), timed out both times", id)
		require.Contains(t, strings.ToLower(j.LastError), "timeout", id)
		require.ErrorIs(t, errs[id], context.DeadlineExceeded, id)
		require.ErrorIs(t, causes[id], jobkey.ErrTimeout, id)
		require.Len(t, ran[id], 2, id)
	}
	// The context ended at the timeout: not before its deadline, which
	// Work set 150 ms ahead a moment before the handler began (timing the
	// handler alone leaves that moment out, and on a loaded machine it is
	// not always under 10 ms), and well before the handler's 5 s.
	require.Zero(t, early, "a context ended before its deadline")
	require.Len(t, budgets, 2)
	for _, b := range budgets {
		require.LessOrEqual(t, b, 150*time.Millisecond, "a deadline past the Timeout")
		require.Greater(t, b, 100*time.Millisecond, "a deadline short of the Timeout")
	}
	for _, d := range ran["watches-ctx"] {
		require.Less(t, d, 2*time.Second, "the context ended at the timeout")
	}
	require.Equal(t, jobkey.StateSucceeded, jobs["fast"].State)
	require.NoError(t, errs["fast"])
}

// Migrate carries each task's Timeout into the job (asynq's default of 30
// minutes included, but not beside a Deadline, as asynq's server applies
// none then), skips what jobkey cannot hold, and MigrateToAsynq carries the
// Timeout back, rounded up to asynq's whole seconds.
func TestMigrateCarriesTimeout(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	later := time.Now().Add(time.Hour)
	enqueueTasksByID(t, e, map[string][]asynq.Option{
		"t-90s":     {asynq.Timeout(90 * time.Second)},
		"t-default": nil,
		"t-sub":     {asynq.Timeout(500 * time.Millisecond)}, // asynq stores 0 and applies 30 minutes
		"t-later":   {asynq.Timeout(time.Hour), asynq.ProcessAt(later)},
		"t-dl":      {asynq.Deadline(later)},                             // asynq stores no Timeout, and applies the Deadline only
		"t-both":    {asynq.Timeout(time.Minute), asynq.Deadline(later)}, // both, the sooner ending each run
		"t-long":    {asynq.Timeout(jobkey.MaxTimeout + time.Hour)},
		"t-neg":     {asynq.Timeout(-5 * time.Second)},
	})
	ti, err := ins.GetTaskInfo("default", "t-sub")
	require.NoError(t, err)
	require.Zero(t, ti.Timeout, "asynq truncates a Timeout to whole seconds")

	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 6, rep.Moved)
	reasons := map[string]string{}
	for _, s := range rep.Skipped {
		reasons[s.ID] = s.Reason
	}
	require.Len(t, reasons, 2)
	require.Contains(t, reasons["t-long"], "MaxTimeout")
	require.Contains(t, reasons["t-neg"], "negative Timeout")
	for id, want := range map[string]time.Duration{
		"t-90s": 90 * time.Second, "t-default": 30 * time.Minute, "t-sub": 30 * time.Minute, "t-later": time.Hour,
		"t-dl": 0, "t-both": time.Minute,
	} {
		j, err := q.Get(e.ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, want, j.Timeout, id)
	}
	for id := range reasons {
		_, err := q.Get(e.ctx, id)
		require.ErrorIs(t, err, jobkey.ErrNotFound, "%s was skipped", id)
		_, err = ins.GetTaskInfo("default", id)
		require.NoError(t, err, "%s stays in asynq", id)
	}

	// Back to asynq, with jobs enqueued in jobkey itself beside the moved
	// ones.
	for id, d := range map[string]time.Duration{"j-1500ms": 1500 * time.Millisecond, "j-1ms": time.Millisecond, "j-none": 0} {
		_, err := q.Enqueue(e.ctx, moveType, []byte(id), &jobkey.EnqueueOpts{ID: id, Timeout: d})
		require.NoError(t, err, id)
	}
	back, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Equal(t, 9, back.Moved)
	require.Empty(t, back.Skipped)
	for id, want := range map[string]time.Duration{
		"t-90s": 90 * time.Second, "t-default": 30 * time.Minute, "t-sub": 30 * time.Minute, "t-later": time.Hour,
		"j-1500ms": 2 * time.Second, "j-1ms": time.Second, "j-none": 30 * time.Minute, "t-dl": 0, "t-both": time.Minute,
	} {
		ti, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, id)
		require.Equal(t, want, ti.Timeout, id)
		if id == "t-dl" || id == "t-both" {
			require.Equal(t, later.Unix(), ti.Deadline.Unix(), id)
		} else {
			require.True(t, ti.Deadline.IsZero(), id)
		}
	}
	require.Empty(t, allJobs(t, e.ctx, q))

	// And a round trip keeps it.
	rep, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 9, rep.Moved)
	j, err := q.Get(e.ctx, "j-1500ms")
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, j.Timeout)
}
