package asynqcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const moveType = "email:welcome"

// asynqTask is what a test put into asynq and expects to find.
type asynqTask struct {
	id, typ, payload string
	state            asynq.TaskState // after setup
	maxRetry         int
	retried          int
	at               time.Time // NextProcessAt after setup (scheduled, retry)
}

// allTasks reads every task of an asynq queue in the states a migration
// touches or leaves.
func allTasks(t *testing.T, ins *asynq.Inspector, queue string) map[string]*asynq.TaskInfo {
	t.Helper()
	out := map[string]*asynq.TaskInfo{}
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		ins.ListPendingTasks, ins.ListScheduledTasks, ins.ListRetryTasks, ins.ListActiveTasks, ins.ListArchivedTasks,
	} {
		for page := 1; ; page++ {
			infos, err := list(queue, asynq.Page(page), asynq.PageSize(1000))
			if errors.Is(err, asynq.ErrQueueNotFound) {
				break
			}
			require.NoError(t, err)
			for _, ti := range infos {
				if _, dup := out[ti.ID]; dup {
					t.Fatalf("task %s listed twice in asynq", ti.ID)
				}
				out[ti.ID] = ti
			}
			if len(infos) < 1000 {
				break
			}
		}
	}
	return out
}

// allJobs reads every job of a jobkey queue, in every state.
func allJobs(t *testing.T, ctx context.Context, q *jobkey.Queue) map[string]*jobkey.Job {
	t.Helper()
	out := map[string]*jobkey.Job{}
	for _, st := range []jobkey.State{jobkey.StatePending, jobkey.StateActive, jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled} {
		cursor := ""
		for {
			page, err := q.List(ctx, jobkey.ListOpts{State: st, Limit: jobkey.MaxListLimit, Cursor: cursor})
			require.NoError(t, err)
			require.Empty(t, page.Unreadable)
			for _, j := range page.Jobs {
				if _, dup := out[j.ID]; dup {
					t.Fatalf("job %s listed twice in jobkey", j.ID)
				}
				out[j.ID] = j
			}
			if page.Next == "" {
				break
			}
			cursor = page.Next
		}
	}
	return out
}

// setupAsynq fills asynq with n tasks of mixed types and states in queue
// "default" (retry tasks made by a real asynq server whose handler fails),
// plus tasks of the moved type in queue "other", and holds `hold` tasks of
// the moved type active in a running server. It pauses "default" so the
// held server takes nothing more, and returns the tasks and a func that
// releases the held handlers and stops the server.
func setupAsynq(t *testing.T, e *env, n, hold int) (map[string]*asynqTask, func()) {
	t.Helper()
	ac := asynq.NewClientFromRedisClient(e.rdb)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	rng := rand.New(rand.NewPCG(1, 2))
	tasks := map[string]*asynqTask{}
	typeOf := func(i int) string {
		switch i % 5 {
		case 0, 1, 2:
			return moveType
		case 3:
			return "email:digest"
		}
		return "image:resize"
	}
	add := func(tk *asynqTask, opts ...asynq.Option) {
		opts = append(opts, asynq.TaskID(tk.id), asynq.MaxRetry(tk.maxRetry))
		info, err := ac.EnqueueContext(e.ctx, asynq.NewTask(tk.typ, []byte(tk.payload)), opts...)
		require.NoError(t, err)
		tk.at = info.NextProcessAt
		tk.state = info.State
		tasks[tk.id] = tk
	}

	// First the tasks a real server fails into retry, and those it holds.
	nRetry := n / 5
	for i := range nRetry {
		add(&asynqTask{id: fmt.Sprintf("r-%d", i), typ: typeOf(i), payload: fmt.Sprintf("retry-%d", i), maxRetry: 3 + i%20})
	}
	for i := range hold {
		add(&asynqTask{id: fmt.Sprintf("h-%d", i), typ: moveType, payload: fmt.Sprintf("hold-%d", i), maxRetry: 5})
	}
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency:    hold + 20,
		Queues:         map[string]int{"default": 1},
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 3 * time.Hour },
		LogLevel:       asynq.FatalLevel,
	})
	var held atomic.Int32
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if bytes.HasPrefix(task.Payload(), []byte("hold-")) {
			held.Add(1)
			<-release
			return nil
		}
		return errors.New("fail into retry")
	})))
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(release)
			srv.Shutdown()
		}
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool {
		qi, err := ins.GetQueueInfo("default")
		return err == nil && qi.Retry == nRetry && qi.Active == hold && int(held.Load()) == hold
	}, 60*time.Second, 20*time.Millisecond, "asynq server failing tasks into retry")
	require.NoError(t, ins.PauseQueue("default"))
	for _, tk := range tasks {
		ti, err := ins.GetTaskInfo("default", tk.id)
		require.NoError(t, err)
		tk.state, tk.retried, tk.at = ti.State, ti.Retried, ti.NextProcessAt
	}

	// Then pending and scheduled tasks.
	for i := nRetry; i < n-hold; i++ {
		tk := &asynqTask{id: fmt.Sprintf("t-%d", i), typ: typeOf(i), payload: fmt.Sprintf("p-%d", i), maxRetry: i % 30}
		if rng.IntN(8) < 3 {
			add(tk, asynq.ProcessIn(time.Duration(1+rng.IntN(48))*time.Hour))
		} else {
			add(tk)
		}
	}
	// A task jobkey cannot take under its ID, one whose ID jobkey holds
	// with another job, and the moved type in another asynq queue.
	add(&asynqTask{id: "bad{1}", typ: moveType, payload: "braces"})
	add(&asynqTask{id: "taken", typ: moveType, payload: "asynq's"})
	for i := range 50 {
		add(&asynqTask{id: fmt.Sprintf("o-%d", i), typ: moveType, payload: fmt.Sprintf("o-%d", i)}, asynq.Queue("other"))
	}
	return tasks, stop
}

// The acceptance test of the migration: 10,000 asynq tasks of mixed types and
// states; the migration is stopped at random points, by a canceled context
// and by a failure injected between enqueue and delete, and rerun until it
// finishes. Then every task of the type is in exactly one system, once,
// with its ID, payload, run time and remaining retries; other types and
// other queues are untouched; the held active tasks are left and reported.
func TestMigrateInterruptedAndRerun(t *testing.T) {
	t.Parallel()
	n, hold := 10_000, 5
	if testing.Short() {
		n = 1_000
	}
	e := newEnv(t)
	t0 := time.Now()
	tasks, stop := setupAsynq(t, e, n, hold)
	t.Logf("setup: %v", time.Since(t0))
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	q := e.queue(t, "emails", nil)
	_, err := q.Enqueue(e.ctx, moveType, []byte("jobkey's"), &jobkey.EnqueueOpts{ID: "taken"})
	require.NoError(t, err)

	// A dry run writes nothing.
	before := allTasks(t, ins, "default")
	dry, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, DryRun: true})
	require.NoError(t, err)
	want := 0
	for _, tk := range tasks {
		if tk.typ == moveType && tk.state != asynq.TaskStateActive && !strings.HasPrefix(tk.id, "o-") && tk.id != "bad{1}" {
			want++
		}
	}
	require.Equal(t, want, dry.WouldMove, "every waiting task of the type but the one with braces (the taken ID is only found when writing)")
	require.Equal(t, summary(before), summary(allTasks(t, ins, "default")))
	require.Len(t, allJobs(t, e.ctx, q), 1)

	rng := rand.New(rand.NewPCG(3, 4))
	var cancels, injected, runs int
	var final MigrateReport
	start := time.Now()
	for {
		runs++
		require.Less(t, runs, 100, "the migration does not finish")
		ctx, cancel := context.WithCancel(e.ctx)
		opts := MigrateOpts{Type: moveType, To: q, Concurrency: 1 + rng.IntN(16), PageSize: 100 + rng.IntN(900)}
		errInjected := errors.New("injected: crash between enqueue and delete")
		// Interruptions land at a random task of the run: enough of them
		// that every one finds work left to interrupt.
		point := int64(1 + rng.IntN(max(n/12, 10)))
		switch {
		case runs > 12: // enough interruptions: let it finish
		case runs%4 == 0: // canceled while listing
			opts.Progress = func(p MigrateProgress) {
				if p.Phase == "listing" && int64(p.Done) >= point*5 {
					cancel()
				}
			}
		case runs%2 == 0: // canceled while moving
			opts.Progress = func(p MigrateProgress) {
				if p.Phase == "moving" && int64(p.Done) >= point {
					cancel()
				}
			}
		default: // crashed between an enqueue and its delete
			opts.afterEnqueue = failOnCall(point, errInjected)
		}
		rep, err := Migrate(ctx, e.rdb, opts)
		cancel()
		switch {
		case err == nil:
			final = rep
		case errors.Is(err, errInjected):
			injected++
		case errors.Is(err, context.Canceled):
			cancels++
		default:
			require.NoError(t, err)
		}
		if err == nil {
			break
		}
	}
	t.Logf("%d tasks: %d runs (%d canceled, %d crashed between enqueue and delete) in %v", n, runs, cancels, injected, time.Since(start))
	require.Positive(t, cancels, "no run was interrupted by its context")
	require.Positive(t, injected, "no run crashed between enqueue and delete")

	// The finishing run reports where the rest stand.
	var left, skipped []string
	for _, x := range final.Left {
		left = append(left, x.ID)
	}
	for _, x := range final.Skipped {
		skipped = append(skipped, x.ID)
	}
	require.ElementsMatch(t, []string{"h-0", "h-1", "h-2", "h-3", "h-4"}, left)
	require.ElementsMatch(t, []string{"bad{1}", "taken"}, skipped)
	require.Empty(t, final.Undone)
	require.Empty(t, final.Twice)

	// Every task where it must be, exactly once.
	inAsynq := allTasks(t, ins, "default")
	inOther := allTasks(t, ins, "other")
	t0 = time.Now()
	inJobkey := allJobs(t, e.ctx, q)
	t.Logf("read back: %v", time.Since(t0))
	moved := 0
	for id, tk := range tasks {
		a, inA := inAsynq[id]
		if strings.HasPrefix(id, "o-") {
			a, inA = inOther[id]
		}
		j, inJ := inJobkey[id]
		stays := tk.typ != moveType || tk.state == asynq.TaskStateActive || strings.HasPrefix(id, "o-") || id == "bad{1}" || id == "taken"
		if stays {
			require.True(t, inA, "task %s (%s, %s) left asynq", id, tk.typ, tk.state)
			require.Equal(t, tk.state, a.State, id)
			require.Equal(t, tk.payload, string(a.Payload), id)
			if id == "taken" {
				require.Equal(t, "jobkey's", string(j.Payload), "the job under the taken ID is untouched")
			} else {
				require.False(t, inJ, "task %s (%s) is in jobkey too", id, tk.typ)
			}
			continue
		}
		moved++
		require.False(t, inA, "task %s was moved but is still in asynq (%v)", id, a)
		require.True(t, inJ, "task %s (%s) is lost: in neither system", id, tk.state)
		require.Equal(t, jobkey.StatePending, j.State, id)
		require.Equal(t, tk.typ, j.Type, id)
		require.Equal(t, tk.payload, string(j.Payload), id)
		require.Equal(t, max(tk.maxRetry-tk.retried+1, 1), j.MaxAttempts, "%s: remaining retries", id)
		if tk.state != asynq.TaskStatePending {
			require.WithinDuration(t, tk.at, j.RunAt, time.Second, "%s: run time", id)
		}
	}
	require.Equal(t, moved+1, len(inJobkey), "jobkey holds the moved tasks and the job under the taken ID, nothing else")
	require.Equal(t, want-1, moved)
	vr, err := q.Verify(e.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, vr.Findings)

	// A run after the end has nothing left to do.
	again, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Zero(t, again.Moved+again.AlreadyMoved)
	require.Len(t, again.Left, hold)

	// The held tasks finish in asynq.
	stop()
}

func TestMigrateRefusesBadOpts(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := Migrate(e.ctx, e.rdb, MigrateOpts{To: q})
	require.Error(t, err)
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType})
	require.Error(t, err)
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, FromQueue: "nope"})
	require.ErrorIs(t, err, asynq.ErrQueueNotFound)
}

// summary is what a dry run must leave as it was: each task's ID, state,
// type and payload (asynq lists a pending task's NextProcessAt as now).
func summary(m map[string]*asynq.TaskInfo) map[string]string {
	out := map[string]string{}
	for id, ti := range m {
		out[id] = fmt.Sprintf("%s %s %q %d/%d", ti.State, ti.Type, ti.Payload, ti.Retried, ti.MaxRetry)
	}
	return out
}

// failingAsynq runs a real asynq server on queue "default" whose handler
// records asynq.GetRetryCount and GetMaxRetry ("n/m") and fails, retrying
// after retryIn(n) (n: the retries so far), until done reports true.
func failingAsynq(t *testing.T, e *env, seen *[]string, retryIn func(n int) time.Duration, done func() bool) {
	t.Helper()
	var mu sync.Mutex
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 1, Queues: map[string]int{"default": 1}, LogLevel: asynq.FatalLevel,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		RetryDelayFunc:           func(n int, _ error, _ *asynq.Task) time.Duration { return retryIn(n) },
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		n, _ := asynq.GetRetryCount(ctx)
		m, _ := asynq.GetMaxRetry(ctx)
		mu.Lock()
		*seen = append(*seen, fmt.Sprintf("%d/%d", n, m))
		mu.Unlock()
		return errors.New("fails in asynq")
	})))
	require.Eventually(t, done, 20*time.Second, 20*time.Millisecond)
	srv.Shutdown()
}

// failingHandler is an unchanged asynq handler run by jobkey: it records
// asynq.GetRetryCount and GetMaxRetry ("n/m") and fails.
func failingHandler(seen *[]string) jobkey.Handler {
	var mu sync.Mutex
	return HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		n, ok1 := asynq.GetRetryCount(ctx)
		m, ok2 := asynq.GetMaxRetry(ctx)
		if !ok1 || !ok2 {
			return errors.New("asynq helpers not served")
		}
		mu.Lock()
		*seen = append(*seen, fmt.Sprintf("%d/%d", n, m))
		mu.Unlock()
		return errors.New("fails in jobkey")
	})
}

// taskRetried reports whether the asynq task id waits to be retried after
// n retries.
func taskRetried(e *env, id string, n int) func() bool {
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	return func() bool {
		ti, err := ins.GetTaskInfo("default", id)
		return err == nil && ti.State == asynq.TaskStateRetry && ti.Retried == n
	}
}

// A task that failed twice in asynq and then moves goes on counting in
// jobkey: its unchanged handler sees asynq.GetRetryCount 2, then 3, then
// 4, as asynq would show, and it runs MaxRetry+1 times in all, as in asynq.
func TestMigratedTaskKeepsItsRetryCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("p")),
		asynq.TaskID("r"), asynq.MaxRetry(4))
	require.NoError(t, err)
	var inAsynq []string
	failingAsynq(t, e, &inAsynq, func(n int) time.Duration {
		if n == 0 {
			return 0
		}
		return time.Hour // stays in retry, after two runs
	}, taskRetried(e, "r", 2))
	require.Equal(t, []string{"0/4", "1/4"}, inAsynq)
	// Due now (asynq's server is stopped): it keeps its two retries.
	require.NoError(t, asynq.NewInspectorFromRedisClient(e.rdb).RunTask("default", "r"))

	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved)
	j, err := q.Get(e.ctx, "r")
	require.NoError(t, err)
	require.Equal(t, map[string]string{MetaRetried: "2", MetaQueue: "default"}, j.Meta)
	require.Equal(t, 3, j.MaxAttempts)

	var inJobkey []string
	j = work(t, e, q, failingHandler(&inJobkey), "r")["r"]
	require.Equal(t, jobkey.StateFailed, j.State)
	require.Equal(t, []string{"2/4", "3/4", "4/4"}, inJobkey)
	require.Equal(t, 4+1, len(inAsynq)+len(inJobkey), "MaxRetry(4): five runs in all, as in asynq")
}

// A task whose retry count and queue name would take the job's Meta over
// jobkey's limits is not moved with them dropped: it stays in asynq,
// listed as skipped with the reason.
func TestMigrateLeavesATaskWhoseMetaWouldNotFit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	long := strings.Repeat("q", jobkey.MaxMetaBytes)
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("p")),
		asynq.TaskID("big"), asynq.Queue(long))
	require.NoError(t, err)
	for _, dry := range []bool{true, false} {
		rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{FromQueue: long, Type: moveType, To: q, DryRun: dry})
		require.NoError(t, err)
		require.Zero(t, rep.Moved+rep.WouldMove, "dry run %v", dry)
		require.Len(t, rep.Skipped, 1, "dry run %v", dry)
		require.Equal(t, "big", rep.Skipped[0].ID)
		require.Contains(t, rep.Skipped[0].Reason, "Meta")
	}
	_, err = q.Get(e.ctx, "big")
	require.ErrorIs(t, err, jobkey.ErrNotFound)
	ti, err := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo(long, "big")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, ti.State)
}

// skippedReasons returns the report's Skipped notes by task ID.
func skippedReasons(rep MigrateReport) map[string]TaskNote {
	out := map[string]TaskNote{}
	for _, s := range rep.Skipped {
		out[s.ID] = s
	}
	return out
}

// A task enqueued with asynq.Unique stays in asynq, with its unique lock
// intact, listed by name with the reason: moving it would release the lock
// and asynq would take a duplicate, which jobkey would not see.
func TestMigrateLeavesUniqueTasksWithTheirLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	enqueueTasksByID(t, e, map[string][]asynq.Option{
		"u-pending":   {asynq.Unique(time.Hour)},
		"u-scheduled": {asynq.Unique(time.Hour), asynq.ProcessIn(time.Hour)},
		"plain":       nil,
	})
	for _, dry := range []bool{true, false} {
		rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, DryRun: dry})
		require.NoError(t, err)
		require.Equal(t, 1, rep.Moved+rep.WouldMove, "dry run %v", dry)
		skipped := skippedReasons(rep)
		require.Len(t, skipped, 2, "dry run %v", dry)
		for _, id := range []string{"u-pending", "u-scheduled"} {
			require.Contains(t, skipped[id].Reason, "Unique: jobkey has no uniqueness by state yet", id)
		}
	}
	for _, id := range []string{"u-pending", "u-scheduled"} {
		_, err := q.Get(e.ctx, id)
		require.ErrorIs(t, err, jobkey.ErrNotFound, id)
		_, err = ins.GetTaskInfo("default", id)
		require.NoError(t, err, "%s stays in asynq", id)
		// The lock still holds: asynq refuses a duplicate.
		_, err = ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), asynq.Unique(time.Hour))
		require.ErrorIs(t, err, asynq.ErrDuplicateTask, id)
	}
	_, err := q.Get(e.ctx, "plain")
	require.NoError(t, err)
}

// Tasks in an asynq Group (waiting to be aggregated, or scheduled to join
// one) stay in asynq, each listed by name with the reason: jobkey has no
// aggregation, and would drop it. A task with a Retention moves.
func TestMigrateLeavesGroupTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	enqueueTasksByID(t, e, map[string][]asynq.Option{
		"retained":      {asynq.Retention(time.Hour)},
		"grouped":       {asynq.Group("batch")},
		"grouped-later": {asynq.Group("batch"), asynq.ProcessIn(time.Hour)},
		"plain":         nil,
	})
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask("other", nil), asynq.TaskID("other-grouped"), asynq.Group("batch"))
	require.NoError(t, err)
	for _, dry := range []bool{true, false} {
		rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, DryRun: dry, PageSize: 1})
		require.NoError(t, err)
		require.Equal(t, 2, rep.Moved+rep.WouldMove, "dry run %v", dry)
		skipped := skippedReasons(rep)
		require.Len(t, skipped, 2, "dry run %v", dry)
		require.Contains(t, skipped["grouped"].Reason, `Group ("batch")`)
		require.Equal(t, "aggregating", skipped["grouped"].State)
		require.Contains(t, skipped["grouped-later"].Reason, `Group ("batch")`)
	}
	for _, id := range []string{"grouped", "grouped-later"} {
		_, err := q.Get(e.ctx, id)
		require.ErrorIs(t, err, jobkey.ErrNotFound, id)
		ti, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, "%s stays in asynq", id)
		require.NotEqual(t, asynq.TaskStateCompleted, ti.State, id)
	}
	ti, err := ins.GetTaskInfo("default", "grouped")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateAggregating, ti.State)
	require.Equal(t, "batch", ti.Group)
}

// Migrate carries a task's Retention and Deadline into the job, and
// MigrateToAsynq carries them back as asynq.Retention and asynq.Deadline
// (whole seconds, as asynq keeps them): no task with either stays behind
// any more, and a round trip keeps both. What jobkey cannot hold (a
// Retention over MaxRetention) stays in asynq, listed with the reason.
func TestMigrateCarriesRetentionAndDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	deadline := time.Now().Add(time.Hour).Truncate(time.Second)
	enqueueTasksByID(t, e, map[string][]asynq.Option{
		"retained":  {asynq.Retention(90 * time.Minute)},
		"deadlined": {asynq.Deadline(deadline)},
		"both":      {asynq.Retention(time.Hour), asynq.Deadline(deadline), asynq.Timeout(time.Minute)},
		"too-long":  {asynq.Retention(jobkey.MaxRetention + time.Hour)},
	})
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Moved)
	skipped := skippedReasons(rep)
	require.Len(t, skipped, 1)
	require.Contains(t, skipped["too-long"].Reason, "MaxRetention")
	want := map[string]struct {
		retention time.Duration
		deadline  time.Time
		timeout   time.Duration
	}{
		"retained":  {90 * time.Minute, time.Time{}, 30 * time.Minute},
		"deadlined": {0, deadline.UTC(), 0}, // asynq's server applies the Deadline alone
		"both":      {time.Hour, deadline.UTC(), time.Minute},
	}
	for id, w := range want {
		j, err := q.Get(e.ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, w.retention, j.Retention, id)
		require.Equal(t, w.deadline, j.Deadline, id)
		require.Equal(t, w.timeout, j.Timeout, id)
	}

	// A job enqueued in jobkey itself, to the millisecond, goes back too.
	_, err = q.Enqueue(e.ctx, moveType, []byte("own"), &jobkey.EnqueueOpts{ID: "own", Retention: 1500 * time.Millisecond,
		Deadline: deadline.Add(700 * time.Millisecond)})
	require.NoError(t, err)
	back, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Equal(t, 4, back.Moved)
	require.Empty(t, back.Skipped)
	want["own"] = struct {
		retention time.Duration
		deadline  time.Time
		timeout   time.Duration
	}{2 * time.Second, deadline.UTC(), 0}
	for id, w := range want {
		ti, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, id)
		require.Equal(t, w.retention, ti.Retention, "%s: Retention rounded up to whole seconds", id)
		require.Equal(t, w.deadline.Unix(), ti.Deadline.Unix(), "%s: Deadline kept to the second, as asynq keeps it", id)
		require.Equal(t, w.deadline.IsZero(), ti.Deadline.IsZero(), id)
	}
	require.Empty(t, allJobs(t, e.ctx, q))

	// And into jobkey again: a round trip keeps both.
	rep, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 4, rep.Moved)
	j, err := q.Get(e.ctx, "both")
	require.NoError(t, err)
	require.Equal(t, time.Hour, j.Retention)
	require.Equal(t, deadline.UTC(), j.Deadline)
}

// The error of a task's last failure in asynq becomes the jobkey job's
// LastError, also when a killed run's move is finished by a rerun.
func TestMigrateCarriesTheLastError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for _, id := range []string{"a", "b"} {
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id), asynq.MaxRetry(4))
		require.NoError(t, err)
	}
	var inAsynq []string
	ab := func() bool { return taskRetried(e, "a", 1)() && taskRetried(e, "b", 1)() }
	failingAsynq(t, e, &inAsynq, func(int) time.Duration { return time.Hour }, ab)
	var crashed atomic.Bool
	requireRerunFinishesCrashedMove(t, e, Migrate,
		MigrateOpts{Type: moveType, To: q, Concurrency: 1, crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: time.Second},
		MigrateOpts{Type: moveType, To: q, Wait: 5 * time.Second})
	for _, id := range []string{"a", "b"} {
		j, err := q.Get(e.ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, "fails in asynq", j.LastError, id)
		require.Equal(t, "1", j.Meta[MetaRetried], id)
	}
}

// failOnCall returns a hook that returns err on its point-th call (counted
// from 1) and nil on every other.
func failOnCall(point int64, err error) func(string) error {
	var calls atomic.Int64
	return func(string) error {
		if calls.Add(1) == point {
			return err
		}
		return nil
	}
}

// enqueueTasksByID enqueues into asynq's queue "default" a task of moveType
// for each ID in tasks, with that ID as its task ID and payload, and its
// options.
func enqueueTasksByID(t *testing.T, e *env, tasks map[string][]asynq.Option) {
	t.Helper()
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for id, opts := range tasks {
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), append(opts, asynq.TaskID(id))...)
		require.NoError(t, err, id)
	}
}

// requireRerunFinishesCrashedMove runs move with crashing, which crashes
// after the first of two enqueues, then with rerun, and requires the rerun
// to finish the crashed move (AlreadyMoved) and make the other (Moved).
func requireRerunFinishesCrashedMove[O MigrateOpts | RollbackOpts](t *testing.T, e *env, move func(context.Context, redis.UniversalClient, O) (MigrateReport, error), crashing, rerun O) {
	t.Helper()
	_, err := move(e.ctx, e.rdb, crashing)
	require.ErrorIs(t, err, errCrash)
	rep, err := move(e.ctx, e.rdb, rerun)
	require.NoError(t, err)
	require.Equal(t, 1, rep.AlreadyMoved)
	require.Equal(t, 1, rep.Moved)
}
