package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// both runs an asynq server on queue "default" and a jobkey worker on q,
// each running every task it gets, slowly, and counting the runs of each
// ID across the two; stop ends both.
func both(t *testing.T, e *env, q *jobkey.Queue, runs *sync.Map) (stop func()) {
	t.Helper()
	return bothOn(t, e, q, runs, "default")
}

// bothOn is both, with asynq's server on the given asynq queues.
func bothOn(t *testing.T, e *env, q *jobkey.Queue, runs *sync.Map, queues ...string) (stop func()) {
	t.Helper()
	weights := map[string]int{}
	for _, aq := range queues {
		weights[aq] = 1
	}
	hit := func(id string) {
		n, _ := runs.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		// Slow, so that moves race runs on the pending list. Under load a
		// migration may still lose every race (see parkedFor).
		time.Sleep(20 * time.Millisecond)
	}
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 1, Queues: weights, LogLevel: asynq.FatalLevel,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		hit(id)
		return nil
	})))
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
			hit(j.ID)
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 4, PollInterval: 10 * time.Millisecond})
	}()
	return func() {
		srv.Shutdown()
		cancel()
		<-done
	}
}

// ranOnce waits until every ID has run, and then checks, a while later,
// that each ran exactly once: none twice, none lost, none stuck.
func ranOnce(t *testing.T, runs *sync.Map, ids []string) {
	t.Helper()
	all := func() bool {
		for _, id := range ids {
			if count(runs, id) == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !all() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a second run, if any, has time to show
	for _, id := range ids {
		require.Equal(t, 1, count(runs, id), "task %s ran %d times (0: lost or stuck)", id, count(runs, id))
	}
}

// unparkInJobkey makes due the parked tasks of a migration into jobkey,
// each of which must be in jobkey, pending and not held, at the run time
// asynq had for it, and no longer in asynq.
func unparkInJobkey(t *testing.T, e *env, q *jobkey.Queue, ids []string) {
	t.Helper()
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	for _, id := range ids {
		_, err := ins.GetTaskInfo("default", id)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "parked task %s is out of asynq", id)
		_, err = q.Update(e.ctx, id, func(j *jobkey.Job) error {
			if j.State != jobkey.StatePending || j.RunAt.Equal(holdUntil) || time.Until(j.RunAt) < parkedFor/2 {
				return fmt.Errorf("it is %s, due at %v", j.State, j.RunAt)
			}
			j.RunAt = time.Now()
			return nil
		})
		require.NoError(t, err, "parked task %s is in jobkey, pending at its own run time", id)
	}
}

// unparkInAsynq makes due the parked jobs of a migration into asynq, each
// of which must be in asynq, scheduled at the run time jobkey had for it
// (not held), and no longer in jobkey.
func unparkInAsynq(t *testing.T, e *env, q *jobkey.Queue, ids []string) {
	t.Helper()
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	for _, id := range ids {
		_, err := q.Get(e.ctx, id)
		require.ErrorIs(t, err, jobkey.ErrNotFound, "parked job %s is out of jobkey", id)
		ti, err := ins.GetTaskInfo("default", id)
		require.NoError(t, err, "parked job %s is in asynq", id)
		require.Equal(t, asynq.TaskStateScheduled, ti.State, "parked job %s", id)
		require.True(t, time.Until(ti.NextProcessAt) > parkedFor/2 && ti.NextProcessAt.Before(holdUntil),
			"parked job %s is due in asynq at its own run time, not %v", id, ti.NextProcessAt)
		require.NoError(t, ins.RunTask("default", id))
	}
}

func crashOnce(point string, crashed *atomic.Bool) func(string, string) error {
	return func(p, id string) error {
		if p == point && crashed.CompareAndSwap(false, true) {
			return fmt.Errorf("at %s of %s: %w", p, id, errCrash)
		}
		return nil
	}
}

// parkedFor is how far ahead the crash tests schedule their parked tasks:
// ones neither system's workers can run before the migration moves them,
// however slow the machine. A move passes every crash point only with a
// task whose source still holds it waiting when the move switches it, and
// under load (go test -race -parallel 8 on two cores) a run of 200 moves,
// whose state writes are serialized, took 17 s: asynq's server (or
// jobkey's workers), ahead of it on the same list, ran every due task
// first, the tasks scheduled seconds ahead too, and each move was undone
// (MigrateReport.Undone) before its delete, so that no run crashed after
// it. An hour is past the tests' own context (two minutes): only the test
// makes a parked task due, after the rerun, where the moves put it.
const parkedFor = time.Hour

// parked says whether a crash test's i-th task is parked (see parkedFor).
func parked(i int) bool { return i%10 == 1 }

var crashPoints = []string{atBeforeEnqueue, atAfterEnqueue, atAfterReread, atAfterDelete, atAfterRelease}

// A migration into jobkey killed at any step of a move, with asynq's
// server and jobkey's workers both running, is finished by a rerun: every
// task runs exactly once, in one of the two systems, and a queue the
// killed run paused is resumed by the rerun (which does not pause it).
func TestMigrateCrashedAtAnyStepRunsEachTaskOnce(t *testing.T) {
	t.Parallel()
	for _, point := range crashPoints {
		for _, pause := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pause=%v", point, pause), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				q := e.queue(t, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				ac := asynq.NewClientFromRedisClient(e.rdb)
				var ids, parkedIDs []string
				for i := range 200 {
					id := fmt.Sprintf("t-%d", i)
					ids = append(ids, id)
					opts := []asynq.Option{asynq.TaskID(id)}
					switch {
					case parked(i):
						opts = append(opts, asynq.ProcessIn(parkedFor))
						parkedIDs = append(parkedIDs, id)
					case i%3 == 0:
						opts = append(opts, asynq.ProcessIn(300*time.Millisecond))
					}
					_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), opts...)
					require.NoError(t, err)
				}
				var runs sync.Map
				stop := both(t, e, q, &runs)
				defer stop()

				var crashed atomic.Bool
				_, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: pause, Concurrency: 4,
					crashAt: crashOnce(point, &crashed), lockTTL: 2 * time.Second})
				require.ErrorIs(t, err, errCrash)
				rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, Wait: 10 * time.Second})
				require.NoError(t, err)
				t.Logf("rerun: moved %d, finished %d, undone %d, left %d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Left))
				require.Empty(t, rep.Twice)
				unparkInJobkey(t, e, q, parkedIDs)
				ranOnce(t, &runs, ids)
				qi, err := asynq.NewInspectorFromRedisClient(e.rdb).GetQueueInfo("default")
				require.NoError(t, err)
				require.False(t, qi.Paused, "the queue the killed run paused is resumed")
				n, err := e.rdb.Exists(e.ctx, stateKey("default"), lockKey("default")).Result()
				require.NoError(t, err)
				require.Zero(t, n, "no migration state or lock is left")
			})
		}
	}
}

// The same for the way back: a migration into asynq killed at any step of
// a move, with both systems' workers running, is finished by a rerun, and
// every job runs exactly once.
func TestMigrateToAsynqCrashedAtAnyStepRunsEachJobOnce(t *testing.T) {
	t.Parallel()
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			q := e.queue(t, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			var ids, parkedIDs []string
			var specs []jobkey.JobSpec
			for i := range 200 {
				id := fmt.Sprintf("j-%d", i)
				ids = append(ids, id)
				o := &jobkey.EnqueueOpts{ID: id}
				switch {
				case parked(i):
					o.RunAt = time.Now().Add(parkedFor)
					parkedIDs = append(parkedIDs, id)
				case i%3 == 0:
					o.RunAt = time.Now().Add(300 * time.Millisecond)
				}
				specs = append(specs, jobkey.JobSpec{Type: moveType, Payload: []byte(id), Opts: o})
			}
			_, err := q.EnqueueMany(e.ctx, specs)
			require.NoError(t, err)
			var runs sync.Map
			stop := both(t, e, q, &runs)
			defer stop()

			var crashed atomic.Bool
			_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Concurrency: 4,
				crashAt: crashOnce(point, &crashed), lockTTL: 2 * time.Second})
			require.ErrorIs(t, err, errCrash)
			rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Wait: 10 * time.Second})
			require.NoError(t, err)
			t.Logf("rerun: moved %d, finished %d, undone %d, left %d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Left))
			require.Empty(t, rep.Twice)
			unparkInAsynq(t, e, q, parkedIDs)
			ranOnce(t, &runs, ids)
			n, err := e.rdb.Exists(e.ctx, stateKey("default"), lockKey("default")).Result()
			require.NoError(t, err)
			require.Zero(t, n, "no migration state or lock is left")
		})
	}
}

// A queue an operator paused stays paused: a migration with PauseQueue,
// killed and rerun, never resumes it.
func TestMigrateNeverResumesAQueueAnOperatorPaused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for i := range 5 {
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, nil), asynq.TaskID(fmt.Sprint(i)))
		require.NoError(t, err)
	}
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	require.NoError(t, ins.PauseQueue("default"))
	var crashed atomic.Bool
	_, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true,
		crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: 2 * time.Second})
	require.ErrorIs(t, err, errCrash)
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true, Wait: 10 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 5, rep.Moved+rep.AlreadyMoved)
	qi, err := ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.True(t, qi.Paused, "the operator's pause stays")
}

// A rerun waits for a killed run's lock (Wait) instead of refusing; without
// Wait it refuses with ErrMigrationRunning.
func TestMigrateRerunWaitsForADeadRunsLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, nil), asynq.TaskID("x"))
	require.NoError(t, err)
	var crashed atomic.Bool
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q,
		crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: time.Second})
	require.ErrorIs(t, err, errCrash)
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.ErrorIs(t, err, ErrMigrationRunning)
	t0 := time.Now()
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, Wait: 5 * time.Second})
	require.NoError(t, err)
	require.Less(t, time.Since(t0), 3*time.Second)
	require.Equal(t, 1, rep.AlreadyMoved, "the rerun finished the killed run's move")
	_, err = q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.False(t, errors.Is(err, jobkey.ErrNotFound))
}

// A task whose ID jobkey holds as a held copy without this migration's
// marks (no asynq queue in Meta: written by hand, or by a version before
// the marks) is left where it is: making that copy due could run the task
// in both.
func TestMigrateLeavesATaskHeldByAnotherMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
	require.NoError(t, err)
	_, err = q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil})
	require.NoError(t, err)
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Zero(t, rep.Moved+rep.AlreadyMoved)
	require.Len(t, rep.Skipped, 1)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.True(t, j.RunAt.Equal(holdUntil), "the other move's held copy stays held")
	require.Contains(t, allTasks(t, asynq.NewInspectorFromRedisClient(e.rdb), "default"), "x")
}

// A move recorded before its task was judged (as a run of an older
// version left it, killed after the enqueue of the held copy) never
// releases a unique lock either: the rerun leaves the task in asynq with
// its lock, deletes the held copy, and lists the task with the reason.
func TestMigrateRerunLeavesAUniqueTaskItFindsMidMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("u")), asynq.TaskID("u"), asynq.Unique(time.Hour))
	require.NoError(t, err)
	_, err = q.Enqueue(e.ctx, moveType, []byte("u"), &jobkey.EnqueueOpts{ID: "u", RunAt: holdUntil})
	require.NoError(t, err)
	require.NoError(t, e.rdb.Set(e.ctx, stateKey("default"),
		`{"moves":{"u":{"dir":"to-jobkey","step":"enqueue","jobkey_queue":"emails","type":"`+moveType+`","run_at":"2020-01-01T00:00:00Z"}}}`, 0).Err())

	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Zero(t, rep.Moved+rep.AlreadyMoved)
	require.Len(t, rep.Skipped, 1)
	require.Contains(t, rep.Skipped[0].Reason, "Unique: jobkey has no uniqueness by state yet")
	_, err = q.Get(e.ctx, "u")
	require.ErrorIs(t, err, jobkey.ErrNotFound, "the held copy is deleted")
	_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "u")
	require.NoError(t, err, "the task stays in asynq")
	_, err = ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("u")), asynq.Unique(time.Hour))
	require.ErrorIs(t, err, asynq.ErrDuplicateTask, "its lock still holds")
	n, err := e.rdb.Exists(e.ctx, stateKey("default")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the move is forgotten")
}

// A run paused between recording a move into jobkey and enqueuing its held
// copy, past its lock's lifetime, while a second run takes the lock over
// and finishes the queue, leaves no held copy behind when it resumes: every
// task ends runnable in exactly one system, and a third run can still move it.
func TestMigratePausedPastItsLockStrandsNoHeldCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
	require.NoError(t, err)
	bAt := make(chan struct{})
	bErr := make(chan error, 1)
	bRep := make(chan MigrateReport, 1)
	a := MigrateOpts{Type: moveType, To: q, lockTTL: time.Minute} // no renewal during the "stop"
	a.crashAt = func(p, id string) error {
		if p != atBeforeEnqueue {
			return nil
		}
		require.NoError(t, e.rdb.Del(e.ctx, lockKey("default")).Err()) // A's lock expires while stopped
		b := MigrateOpts{Type: moveType, To: q}
		b.crashAt = func(p, id string) error {
			if p != atBeforeEnqueue {
				return nil
			}
			close(bAt)
			require.Eventually(t, func() bool { _, err := q.Get(e.ctx, id); return err == nil }, 10*time.Second, 5*time.Millisecond)
			return nil
		}
		go func() { rep, err := Migrate(e.ctx, e.rdb, b); bRep <- rep; bErr <- err }()
		<-bAt
		return nil // A "resumes": enqueues its held copy
	}
	_, aErr := Migrate(e.ctx, e.rdb, a)
	require.ErrorIs(t, aErr, ErrLockLost)
	require.NoError(t, <-bErr)
	t.Logf("B: %+v", <-bRep)
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	t.Logf("C: %+v", rep)
	j, jerr := q.Get(e.ctx, "x")
	_, aerr := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
	switch {
	case jerr == nil && aerr == nil:
		t.Fatalf("x is in both systems; jobkey copy RunAt %v", j.RunAt)
	case jerr == nil:
		require.False(t, j.RunAt.Equal(holdUntil), "x is stranded held in jobkey, with no move recorded")
	case aerr != nil:
		t.Fatalf("x is in neither system: %v / %v", jerr, aerr)
	}
}

// A held copy of a move into jobkey from this asynq queue that no state
// records (its run lost the lock, and a rerun forgot the move before the
// copy was enqueued) is taken over by the next run, which holds the lock
// and the jobkey queue's claim: the task moves, with the options it has in
// asynq now, and runs in jobkey only.
func TestMigrateTakesOverAnAbandonedHeldCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"), asynq.MaxRetry(7))
	require.NoError(t, err)
	// As a stale run enqueues it: held, with this migration's Meta, and
	// options read before the task changed.
	_, err = q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil, MaxAttempts: 2,
		Meta: map[string]string{MetaRetried: "0", MetaQueue: "default"}})
	require.NoError(t, err)
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved, "%+v", rep)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.False(t, j.RunAt.Equal(holdUntil), "the copy is made due")
	require.Equal(t, 8, j.MaxAttempts, "with the task's options as the run read them")
	require.NotContains(t, allTasks(t, asynq.NewInspectorFromRedisClient(e.rdb), "default"), "x")
}
