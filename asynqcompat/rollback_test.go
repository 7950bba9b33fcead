package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// The rollback moves a type's pending jobs back into asynq, interrupted
// and rerun like the migration: every job ends in asynq exactly once with
// its ID, payload, run time and remaining retries; other types stay in
// jobkey; active jobs are left; an asynq task that holds a job's ID with
// other content is never touched.
// A job with a concurrency key is not moved: asynq would run it without
// its limit. It stays pending in jobkey, listed as skipped with why.
func TestMigrateToAsynqKeepsKeyedJobs(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "keyed", nil)
	keyed, err := q.Enqueue(e.ctx, moveType, []byte("k"), &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
	require.NoError(t, err)
	plain, err := q.Enqueue(e.ctx, moveType, []byte("p"), nil)
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Len(t, rep.Skipped, 1)
	require.Equal(t, keyed.ID, rep.Skipped[0].ID)
	require.Contains(t, rep.Skipped[0].Reason, "concurrency key")
	j, err := q.Get(e.ctx, keyed.ID)
	require.NoError(t, err)
	require.Equal(t, jobkey.StatePending, j.State)
	_, err = q.Get(e.ctx, plain.ID)
	require.ErrorIs(t, err, jobkey.ErrNotFound, "the unkeyed job moved")
	inAsynq := allTasks(t, asynq.NewInspectorFromRedisClient(e.rdb), "default")
	require.Contains(t, inAsynq, plain.ID)
	require.NotContains(t, inAsynq, keyed.ID)
}

func TestMigrateToAsynqInterruptedAndRerun(t *testing.T) {
	t.Parallel()
	n := 2_000
	if testing.Short() {
		n = 300
	}
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Shards: 4})
	ac := asynq.NewClientFromRedisClient(e.rdb)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	later := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	var specs []jobkey.JobSpec
	for i := range n {
		typ := moveType
		if i%3 == 0 {
			typ = "image:resize"
		}
		o := &jobkey.EnqueueOpts{ID: fmt.Sprintf("j-%d", i), MaxAttempts: 1 + i%10}
		if i%4 == 0 {
			o.RunAt = later
		}
		specs = append(specs, jobkey.JobSpec{Type: typ, Payload: fmt.Appendf(nil, "p-%d", i), Opts: o})
	}
	// One job of the type is active; one's ID is taken in asynq by another
	// task.
	_, err := q.Enqueue(e.ctx, moveType, []byte("running"), &jobkey.EnqueueOpts{ID: "running"})
	require.NoError(t, err)
	claimed, err := q.Claim(e.ctx, "w")
	require.NoError(t, err)
	_, err = q.EnqueueMany(e.ctx, specs)
	require.NoError(t, err)
	_, err = ac.Enqueue(asynq.NewTask("other", []byte("x")), asynq.TaskID("j-1"))
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(5, 6))
	var runs, interrupted int
	var final MigrateReport
	for {
		runs++
		require.Less(t, runs, 50)
		ctx, cancel := context.WithCancel(e.ctx)
		opts := RollbackOpts{From: q, Type: moveType, Concurrency: 1 + rng.IntN(8)}
		point := int64(1 + rng.IntN(max(n/20, 5)))
		errInjected := errors.New("injected crash")
		switch {
		case runs > 8:
		case runs%2 == 0:
			opts.Progress = func(p MigrateProgress) {
				if int64(p.Done) >= point {
					cancel()
				}
			}
		default:
			opts.afterEnqueue = failOnCall(point, errInjected)
		}
		rep, err := MigrateToAsynq(ctx, e.rdb, opts)
		cancel()
		if err == nil {
			final = rep
			break
		}
		require.True(t, errors.Is(err, errInjected) || errors.Is(err, context.Canceled), "%v", err)
		interrupted++
	}
	require.Equal(t, 8, interrupted)
	require.Len(t, final.Left, 1)
	require.Equal(t, claimed.ID, final.Left[0].ID)
	require.Len(t, final.Skipped, 1)
	require.Equal(t, "j-1", final.Skipped[0].ID)

	inAsynq := allTasks(t, ins, "default")
	inJobkey := allJobs(t, e.ctx, q)
	for _, s := range specs {
		id := s.Opts.ID
		a, inA := inAsynq[id]
		j, inJ := inJobkey[id]
		if s.Type != moveType || id == "j-1" {
			require.True(t, inJ, "%s stays in jobkey", id)
			if id == "j-1" {
				require.Equal(t, "other", a.Type, "the asynq task under the taken ID is untouched")
			} else {
				require.False(t, inA, "%s (%s) is in asynq too", id, s.Type)
			}
			continue
		}
		require.False(t, inJ, "%s is still in jobkey (%v)", id, j)
		require.True(t, inA, "%s is lost", id)
		require.Equal(t, string(s.Payload), string(a.Payload), id)
		require.Equal(t, s.Type, a.Type, id)
		require.Equal(t, s.Opts.MaxAttempts-1, a.MaxRetry, "%s: remaining retries", id)
		if !s.Opts.RunAt.IsZero() {
			require.Equal(t, asynq.TaskStateScheduled, a.State, id)
			require.WithinDuration(t, later, a.NextProcessAt, time.Second, id)
		} else {
			require.Equal(t, asynq.TaskStatePending, a.State, id)
		}
	}
	require.Contains(t, inJobkey, "running")
	require.Equal(t, jobkey.StateActive, inJobkey["running"].State)
}

// A pending job whose canceled run may still be stopping (retried before
// that run's lease ended) stays in jobkey, listed in Left, until the lease
// ends: jobkey keeps its ID till then, so that no job enqueued again under
// it runs beside that handler. This host's clock spares the asynq copy;
// when it runs ahead of Redis's, jobkey's own refusal leaves the job, and
// its asynq copy is deleted again. A rerun after the lease moves it.
func TestMigrateToAsynqLeavesCanceledRunUntilItsLeaseEnds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		now  func() time.Time
	}{
		{"host clock agrees", nil},
		{"host clock ahead", func() time.Time { return time.Now().Add(time.Minute) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			q := e.queue(t, "stopping", &jobkey.Config{Lease: 2 * time.Second})
			_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x"})
			require.NoError(t, err)
			run, err := q.Claim(e.ctx, "w")
			require.NoError(t, err)
			_, err = q.Cancel(e.ctx, "x") // its handler may run until its lease ends
			require.NoError(t, err)
			_, err = q.Retry(e.ctx, "x")
			require.NoError(t, err)
			_, err = q.Enqueue(e.ctx, moveType, []byte("y"), &jobkey.EnqueueOpts{ID: "y"})
			require.NoError(t, err)

			rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, now: tc.now})
			require.NoError(t, err)
			t.Logf("moved %d, left %+v, undone %+v, twice %+v", rep.Moved, rep.Left, rep.Undone, rep.Twice)
			require.Equal(t, 1, rep.Moved, "y")
			require.Len(t, rep.Left, 1)
			require.Equal(t, "x", rep.Left[0].ID)
			require.Contains(t, rep.Left[0].Reason, "may still be stopping")
			require.Empty(t, rep.Undone)
			require.Empty(t, rep.Twice)
			j, err := q.Get(e.ctx, "x")
			require.NoError(t, err, "x stays in jobkey")
			require.Equal(t, jobkey.StatePending, j.State)
			ins := asynq.NewInspectorFromRedisClient(e.rdb)
			inAsynq := allTasks(t, ins, "default")
			require.NotContains(t, inAsynq, "x")
			require.Contains(t, inAsynq, "y")

			time.Sleep(time.Until(run.LeaseUntil) + 100*time.Millisecond)
			rep, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
			require.NoError(t, err)
			require.Equal(t, 1, rep.Moved, "x, once the canceled run's lease ended")
			require.Contains(t, allTasks(t, ins, "default"), "x")
		})
	}
}

// A pending job held without a hold's mark of a move into asynq (the
// held copy of a move into jobkey, or one held by hand) is left as it is:
// moved back and then deleted again by a move into jobkey, it would run in
// both asynq queues.
func TestMigrateToAsynqLeavesAJobHeldByAnotherMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil})
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Zero(t, rep.Moved)
	require.Len(t, rep.Left, 1)
	require.Contains(t, rep.Left[0].Reason, "held by a migration into jobkey")
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.True(t, j.RunAt.Equal(holdUntil))
	require.NotContains(t, allTasks(t, asynq.NewInspectorFromRedisClient(e.rdb), "default"), "x")
}

// A task moved back to asynq keeps counting there: its asynq copy's
// Retried is the retries spent in asynq before the first move plus the
// runs jobkey made, and its MaxRetry leaves it the runs jobkey would have,
// so it runs MaxRetry+1 times in all, as if it had stayed in asynq. The
// same holds when the rollback is killed after the enqueue and rerun.
func TestMigrateToAsynqKeepsTheRetryCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A failed run in jobkey waits an hour: the job stays pending to move.
	q := e.queue(t, "emails", &jobkey.Config{Backoff: func(int) time.Duration { return time.Hour }})
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("p")),
		asynq.TaskID("r"), asynq.MaxRetry(4))
	require.NoError(t, err)
	var seen []string
	failingAsynq(t, e, &seen, func(n int) time.Duration {
		if n == 0 {
			return 0
		}
		return time.Hour
	}, taskRetried(e, "r", 2))
	require.NoError(t, ins.RunTask("default", "r"))
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)

	// One failed run in jobkey.
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, failingHandler(&seen), &jobkey.WorkOpts{Concurrency: 1, PollInterval: 20 * time.Millisecond})
	}()
	require.Eventually(t, func() bool {
		j, err := q.Get(e.ctx, "r")
		return err == nil && j.State == jobkey.StatePending && j.Attempt == 1
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []string{"0/4", "1/4", "2/4"}, seen)

	var crashed atomic.Bool
	_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType,
		crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: 2 * time.Second})
	require.ErrorIs(t, err, errCrash)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Wait: 10 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 1, rep.AlreadyMoved)
	ti, err := ins.GetTaskInfo("default", "r")
	require.NoError(t, err)
	require.Equal(t, 3, ti.Retried, "two retries in asynq, one in jobkey")
	require.Equal(t, 4, ti.MaxRetry)
	require.Equal(t, asynq.TaskStateScheduled, ti.State, "due when jobkey would have retried it")

	require.NoError(t, ins.RunTask("default", "r"))
	failingAsynq(t, e, &seen, func(int) time.Duration { return 0 }, func() bool {
		ti, err := ins.GetTaskInfo("default", "r")
		return err == nil && ti.State == asynq.TaskStateArchived
	})
	require.Equal(t, []string{"0/4", "1/4", "2/4", "3/4", "4/4"}, seen, "MaxRetry(4): five runs in all, as in asynq")
}

// A job with a Priority, or with Meta entries of its own (a trace
// context), stays in jobkey, listed by name with the reason: asynq has no
// per-task priority and nowhere to keep the entries. The entries the
// adapter writes itself do not hold a job back.
func TestMigrateToAsynqLeavesPriorityAndMeta(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	for id, eo := range map[string]*jobkey.EnqueueOpts{
		"prio":    {Priority: 5},
		"traced":  {Meta: map[string]string{"traceparent": "00-abc-def-01", MetaQueue: "default"}},
		"adapter": {Meta: map[string]string{MetaRetried: "2", MetaQueue: "default"}},
		"plain":   {},
	} {
		eo.ID = id
		_, err := q.Enqueue(e.ctx, moveType, []byte(id), eo)
		require.NoError(t, err, id)
	}
	for _, dry := range []bool{true, false} {
		rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, DryRun: dry})
		require.NoError(t, err)
		require.Equal(t, 2, rep.Moved+rep.WouldMove, "dry run %v", dry)
		skipped := skippedReasons(rep)
		require.Len(t, skipped, 2, "dry run %v", dry)
		require.Contains(t, skipped["prio"].Reason, "Priority (5)")
		require.Contains(t, skipped["traced"].Reason, `Meta ("traceparent")`)
	}
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	for _, id := range []string{"prio", "traced"} {
		j, err := q.Get(e.ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, jobkey.StatePending, j.State, id)
		_, err = ins.GetTaskInfo("default", id)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, id)
	}
	for _, id := range []string{"adapter", "plain"} {
		_, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, "%s moved", id)
	}
}

// MigrateToAsynq with PauseQueue pauses the asynq queue it moves into while
// jobs move, and records it: a run killed mid-move leaves the queue
// paused, and the rerun (without PauseQueue) resumes it; a queue an
// operator paused stays paused.
func TestMigrateToAsynqPausesTheTargetQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	for i := range 5 {
		_, err := q.Enqueue(e.ctx, moveType, nil, &jobkey.EnqueueOpts{ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	paused := func() bool {
		n, err := e.rdb.Exists(e.ctx, asynqPausedKey("default")).Result()
		require.NoError(t, err)
		return n == 1
	}
	var crashed atomic.Bool
	var pausedMidMove atomic.Bool
	_, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, PauseQueue: true, lockTTL: time.Second,
		afterEnqueue: func(string) error { pausedMidMove.Store(paused()); return nil },
		crashAt:      crashOnce(atAfterRelease, &crashed)})
	require.ErrorIs(t, err, errCrash)
	require.True(t, pausedMidMove.Load(), "the asynq queue was not paused while a job moved")
	require.True(t, paused(), "the killed run leaves the queue paused")
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Wait: 5 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 5, rep.Moved+rep.AlreadyMoved)
	require.False(t, paused(), "the rerun resumes the queue the killed run paused")

	// An operator's pause stays.
	_, err = q.Enqueue(e.ctx, moveType, nil, &jobkey.EnqueueOpts{ID: "later"})
	require.NoError(t, err)
	require.NoError(t, ins.PauseQueue("default"))
	rep, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, PauseQueue: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved)
	require.True(t, paused(), "the operator's pause stays")
}

// The held asynq copy of a move into asynq, run by hand (asynq's CLI "task
// run", Inspector.RunTask) while the move waits between its steps, runs in
// asynq only: neither the run nor its rerun puts the task into asynq again
// once that copy is done and gone, and the held jobkey job never runs.
func TestMigrateToAsynqHeldCopyRunByHandRunsOnce(t *testing.T) {
	t.Parallel()
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			q := e.queue(t, "emails", nil)
			ins := asynq.NewInspectorFromRedisClient(e.rdb)
			runAt, runs := heldJobWhileBothRun(t, e, q)
			migrateToAsynqActingAt(t, e, q, atAfterEnqueue, crash, func(id string) {
				// The copy is held at the year 9999: run it by hand, and
				// let asynq's server finish it (no retention: it is gone).
				require.NoError(t, ins.RunTask("default", id))
				require.Eventually(t, func() bool {
					_, err := ins.GetTaskInfo("default", id)
					return errors.Is(err, asynq.ErrTaskNotFound)
				}, 10*time.Second, 10*time.Millisecond)
			})
			rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Wait: 5 * time.Second})
			require.NoError(t, err)
			require.Empty(t, rep.Twice)
			time.Sleep(time.Until(runAt) + 500*time.Millisecond) // a second copy would be due by now
			ranOnce(t, runs, []string{"h"})
			_, err = q.Get(e.ctx, "h")
			require.ErrorIs(t, err, jobkey.ErrNotFound, "the held jobkey job is gone")
			_, err = ins.GetTaskInfo("default", "h")
			require.ErrorIs(t, err, asynq.ErrTaskNotFound, "no second asynq copy")
			n, err := e.rdb.Exists(e.ctx, stateKey("default"), lockKey("default")).Result()
			require.NoError(t, err)
			require.Zero(t, n, "no migration state or lock is left")
		})
	}
}

// The held jobkey job of a move into asynq, made due by hand (Queue.Update
// of its RunAt) while the move waits between its steps, runs in jobkey
// only: the asynq copy is never made due beside it.
func TestMigrateToAsynqHeldJobMadeDueByHandRunsOnce(t *testing.T) {
	t.Parallel()
	for _, point := range []string{atBeforeEnqueue, atAfterEnqueue, atAfterReread} {
		for _, crash := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/crash=%v", point, crash), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				q := e.queue(t, "emails", nil)
				runAt, runs := heldJobWhileBothRun(t, e, q)
				err := migrateToAsynqActingAt(t, e, q, point, crash, func(id string) {
					_, err := q.Update(e.ctx, id, func(j *jobkey.Job) error { j.RunAt = time.Now(); return nil })
					require.NoError(t, err)
				})
				if crash {
					_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Wait: 5 * time.Second})
				}
				require.NoError(t, err)
				time.Sleep(time.Until(runAt) + 500*time.Millisecond)
				ranOnce(t, runs, []string{"h"})
				_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "h")
				if err == nil {
					j, jerr := q.Get(e.ctx, "h")
					require.Failf(t, "in both", "asynq copy left, jobkey job %+v %v", j, jerr)
				}
			})
		}
	}
}

// The jobkey job's LastError becomes the asynq copy's LastErr (with a
// LastFailedAt), also when a killed run's move is finished by a rerun; the
// copy is otherwise what asynq's Client would have enqueued.
func TestMigrateToAsynqCarriesTheLastError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	// asynq keeps LastFailedAt in whole seconds: the second the job was
	// written in, or a later one. (Taken after the writes, a second back,
	// it failed when the writes ended late in their second.)
	before := time.Now().Truncate(time.Second)
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(e.ctx, moveType, []byte(id), &jobkey.EnqueueOpts{ID: id, MaxAttempts: 5})
		require.NoError(t, err)
		_, err = q.Update(e.ctx, id, func(j *jobkey.Job) error { j.LastError = "fails in jobkey"; return nil })
		require.NoError(t, err)
	}
	var crashed atomic.Bool
	requireRerunFinishesCrashedMove(t, e, MigrateToAsynq,
		RollbackOpts{From: q, Type: moveType, Concurrency: 1, crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: time.Second},
		RollbackOpts{From: q, Type: moveType, Wait: 5 * time.Second})
	for _, id := range []string{"a", "b"} {
		ti, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, id)
		require.Equal(t, "fails in jobkey", ti.LastErr, id)
		require.False(t, ti.LastFailedAt.Before(before), "%s: LastFailedAt %v, before the write, at %v", id, ti.LastFailedAt, before)
		require.Equal(t, moveType, ti.Type)
		require.Equal(t, []byte(id), ti.Payload)
		require.Equal(t, "default", ti.Queue)
		require.Equal(t, 4, ti.MaxRetry)
		require.Equal(t, 30*time.Minute, ti.Timeout, "asynq's default, as its Client would store")
		require.Equal(t, asynq.TaskStatePending, ti.State)
	}
}

// A jobkey job held by a move into asynq that no state records (a run
// that lost its lock held it after a rerun forgot the move) is given its
// RunAt back from the hold's mark, and moved by the next run: it runs in
// asynq only, when it was due, and is not stranded held in jobkey.
func TestMigrateToAsynqReleasesAnAbandonedHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: at})
	require.NoError(t, err)
	// The stale run's late hold, with no move recorded.
	_, err = q.Update(e.ctx, "x", func(c *jobkey.Job) error { holdJob(c); return nil })
	require.NoError(t, err)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.True(t, j.RunAt.Equal(holdUntil))

	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved, "%+v", rep)
	_, err = q.Get(e.ctx, "x")
	require.ErrorIs(t, err, jobkey.ErrNotFound, "out of jobkey")
	ti, err := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, ti.State)
	require.True(t, ti.NextProcessAt.Equal(at), "due when the job was: %v, want %v", ti.NextProcessAt, at)
}

// A job released by hand from a move's hold keeps the hold's mark, which
// never keeps it from moving into asynq later.
func TestMigrateToAsynqIgnoresALeftoverHoldMark(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x",
		Meta: map[string]string{metaHeldRunAt: time.Now().UTC().Format(time.RFC3339Nano)}})
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved, "%+v", rep)
}

// A job too near jobkey's value limit to take the hold's mark stays in
// jobkey, listed, and the run goes on.
func TestMigrateToAsynqSkipsAJobTooLargeToHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{MaxValueBytes: 1024})
	n := 0
	for size := 600; size < 1024; size++ {
		_, err := q.Enqueue(e.ctx, moveType, make([]byte, size), &jobkey.EnqueueOpts{ID: "probe"})
		if errors.Is(err, jobkey.ErrTooLarge) {
			break
		}
		require.NoError(t, err)
		require.NoError(t, q.Delete(e.ctx, "probe"))
		n = size
	}
	require.NotZero(t, n)
	_, err := q.Enqueue(e.ctx, moveType, make([]byte, n), &jobkey.EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Zero(t, rep.Moved)
	require.Len(t, rep.Skipped, 1, "%+v", rep)
	require.Contains(t, rep.Skipped[0].Reason, "value limit")
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.False(t, j.RunAt.Equal(holdUntil), "not held")
}

// The held jobkey job of a move into asynq, made due by hand after the
// move read it again and found it held but before the write that makes
// the asynq copy due, is reported as due in both (never as moved), and a
// rerun leaves it in one system.
func TestMigrateToAsynqHeldJobMadeDueAfterItsRereadRunsInOneSystem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: at})
	require.NoError(t, err)
	// dueInBoth says whether x is due (not held) in jobkey and in asynq.
	dueInBoth := func() string {
		j, jerr := q.Get(e.ctx, "x")
		ti, aerr := ins.GetTaskInfo("default", "x")
		if jerr == nil && !j.RunAt.Equal(holdUntil) && aerr == nil && !ti.NextProcessAt.Equal(holdUntil) {
			return fmt.Sprintf("due in both: jobkey RunAt %v, asynq %v at %v", j.RunAt, ti.State, ti.NextProcessAt)
		}
		return ""
	}
	var once atomic.Bool
	var seen []string
	hook := func(p, id string) error {
		if p == atHeldChecked && once.CompareAndSwap(false, true) {
			_, err := q.Update(e.ctx, id, func(j *jobkey.Job) error { j.RunAt = at; return nil })
			require.NoError(t, err)
		}
		if s := dueInBoth(); s != "" {
			seen = append(seen, p+": "+s)
		}
		return nil
	}
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Concurrency: 1, crashAt: hook})
	require.NoError(t, err)
	require.True(t, once.Load(), "the hook ran")
	t.Logf("seen: %q", seen)
	if len(seen) > 0 {
		// The check does not WATCH the jobkey job (outside the asynq
		// queue's slot): the window is reported, never counted as a move.
		require.Len(t, rep.Twice, 1, "report %+v", rep)
		require.Equal(t, "x", rep.Twice[0].ID)
	}
	require.LessOrEqual(t, rep.Moved, 1, "one job: %+v", rep)
	_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Empty(t, dueInBoth(), "a rerun moves the job due in jobkey")
	_, err = q.Get(e.ctx, "x")
	require.ErrorIs(t, err, jobkey.ErrNotFound)
}

// A held jobkey job whose hold's mark cannot be read is reported and kept
// held, and the migration moves the other jobs: one forged mark never
// stops every run of the migration.
func TestMigrateToAsynqKeepsAHoldWithAnUnreadableMarkAndMovesTheRest(t *testing.T) {
	t.Parallel()
	for _, mark := range []string{"garbage", "", "-0001-01-01T00:00:00Z", "10000-01-01T00:00:00Z"} {
		e := newEnv(t)
		q := e.queue(t, "emails", nil)
		_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil,
			Meta: map[string]string{metaHeldRunAt: mark}})
		require.NoError(t, err)
		_, err = q.Enqueue(e.ctx, moveType, []byte("y"), &jobkey.EnqueueOpts{ID: "y"})
		require.NoError(t, err)
		rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
		require.NoError(t, err, "mark %q", mark)
		require.Equal(t, 1, rep.Moved, "mark %q: %+v", mark, rep)
		j, err := q.Get(e.ctx, "x")
		require.NoError(t, err, "kept")
		require.True(t, j.RunAt.Equal(holdUntil), "kept held")
		require.Equal(t, mark, j.Meta[metaHeldRunAt], "its mark kept")
		var found bool
		for _, n := range rep.Skipped {
			found = found || n.ID == "x"
		}
		require.True(t, found, "mark %q: reported: %+v", mark, rep)
		_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
		require.Error(t, err, "not in asynq")
	}
}

// A held job whose mark gives a RunAt far in the past or far in the future
// is moved once, due no earlier than the mark says, and no panic.
func TestMigrateToAsynqReleasesAHoldWithAnExtremeMark(t *testing.T) {
	t.Parallel()
	for _, at := range []time.Time{time.Time{}, time.Unix(-1<<40, 0).UTC(), holdUntil, time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)} {
		e := newEnv(t)
		q := e.queue(t, "emails", nil)
		_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil,
			Meta: map[string]string{metaHeldRunAt: at.Format(time.RFC3339Nano)}})
		require.NoError(t, err)
		rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
		t.Logf("mark %v: %+v %v", at, rep, err)
		j, jerr := q.Get(e.ctx, "x")
		ti, aerr := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
		switch {
		case jerr == nil && aerr == nil:
			t.Fatalf("mark %v: in both: %+v / %+v", at, j, ti)
		case jerr != nil && aerr != nil:
			t.Fatalf("mark %v: lost: %v / %v", at, jerr, aerr)
		case aerr == nil:
			require.False(t, ti.NextProcessAt.Before(at.Truncate(time.Second)) && at.After(time.Now()), "mark %v: due at %v", at, ti.NextProcessAt)
		}
	}
}

// A user's Meta entry under the hold's mark key is the user's: a job
// that holds it moves no differently from one with any other own Meta.
func TestMigrateToAsynqKeepsAUsersEntryUnderTheHoldMarkKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x",
		Meta: map[string]string{metaHeldRunAt: "mine"}})
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Zero(t, rep.Moved, "%+v", rep)
	require.Len(t, rep.Skipped, 1, "%+v", rep)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err, "kept in jobkey")
	require.Equal(t, "mine", j.Meta[metaHeldRunAt], "its Meta kept")
	_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
	require.Error(t, err, "not in asynq")
}

// heldJobWhileBothRun enqueues job "h" into q, due in a second (pending, not
// taken by a worker, when a move lists it), and runs asynq's server and
// jobkey's workers until the test ends. It returns h's RunAt and the runs
// of each ID in either system.
func heldJobWhileBothRun(t *testing.T, e *env, q *jobkey.Queue) (runAt time.Time, runs *sync.Map) {
	t.Helper()
	runAt = time.Now().Add(time.Second)
	_, err := q.Enqueue(e.ctx, moveType, []byte("p"), &jobkey.EnqueueOpts{ID: "h", RunAt: runAt})
	require.NoError(t, err)
	runs = new(sync.Map)
	t.Cleanup(both(t, e, q, runs))
	return runAt, runs
}

// migrateToAsynqActingAt moves q's jobs of moveType into asynq and calls
// act with the job's ID when the move reaches point; with crash, the move
// then crashes there, and its error must say so. It returns the move's
// error.
func migrateToAsynqActingAt(t *testing.T, e *env, q *jobkey.Queue, point string, crash bool, act func(id string)) error {
	t.Helper()
	hook := func(p, id string) error {
		if p != point {
			return nil
		}
		act(id)
		if crash {
			return errCrash
		}
		return nil
	}
	_, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, crashAt: hook, lockTTL: time.Second})
	if crash {
		require.ErrorIs(t, err, errCrash)
	}
	return err
}
