package asynqcompat

import (
	"context"
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

// runAsynqUntil runs a real asynq server on queue "default" until done
// reports true, counting the runs of each task ID in runs.
func runAsynqUntil(t *testing.T, e *env, runs *sync.Map, done func() bool) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 2, Queues: map[string]int{"default": 1}, LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, _ := runs.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return nil
	})))
	deadline := time.Now().Add(20 * time.Second)
	for !done() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	srv.Shutdown()
	require.True(t, done(), "asynq server did not run the task")
}

// requireOneMovedOtherRanAndUndone requires that, of the two tasks or jobs
// (what) "a" and "b", each either ran once in the source system (from,
// counted in runs) or is held once by the target (to, as held reports), not
// both; and that the report rep says one moved and the other, the one that
// ran, was undone. It returns the ID of the one that ran.
func requireOneMovedOtherRanAndUndone(t *testing.T, rep MigrateReport, what, from string, runs *sync.Map, to string, held func(id string) (state string, ok bool)) (ran string) {
	t.Helper()
	for _, id := range []string{"a", "b"} {
		inTarget := 0
		if state, ok := held(id); ok {
			inTarget = 1
			t.Logf("%s %s: ran %d times in %s, %s holds it %s", what, id, count(runs, id), from, to, state)
		}
		require.Equal(t, 1, count(runs, id)+inTarget,
			"%s %s: ran %d times in %s and is in %s %d times: it runs twice (report Moved=%d, Twice=%d, Undone=%d)",
			what, id, count(runs, id), from, to, inTarget, rep.Moved, len(rep.Twice), len(rep.Undone))
	}
	require.Equal(t, 1, rep.Moved)
	require.Len(t, rep.Undone, 1)
	require.Empty(t, rep.Twice)
	ran = "a"
	if count(runs, "b") == 1 {
		ran = "b"
	}
	require.Equal(t, ran, rep.Undone[0].ID)
	return ran
}

func count(m *sync.Map, id string) int {
	n, ok := m.Load(id)
	if !ok {
		return 0
	}
	return int(n.(*atomic.Int32).Load())
}

// Migrate moves from a listing that may be stale: a task that an asynq
// server takes and FINISHES between the listing and its move (asynq then
// deletes it) must not run again in jobkey. Before the fix, it was enqueued
// into jobkey afresh, the delete's "task not found" counted as success and
// the report said Moved=2, Undone=0: task "b" ran once in asynq AND was
// pending in jobkey. Now the move confirms the task still waits in asynq
// before it deletes it, and deletes the jobkey copy again (while pending)
// when it does not: each task runs once, and the report says Undone.
func TestMigrateStaleListingRunsOnce(t *testing.T) {
	e := newEnv(t)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for _, id := range []string{"a", "b"} {
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("p-"+id)), asynq.TaskID(id))
		require.NoError(t, err)
	}
	q := e.queue(t, "emails", nil)
	var asynqRuns sync.Map
	var once sync.Once
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, Concurrency: 1,
		Progress: func(p MigrateProgress) {
			if p.Phase == "moving" && p.Pass == 1 && p.Done == 1 {
				// One task moved; an asynq server (running as it always
				// was) takes the other one and finishes it.
				once.Do(func() {
					runAsynqUntil(t, e, &asynqRuns, func() bool { return count(&asynqRuns, "a")+count(&asynqRuns, "b") == 1 })
				})
			}
		}})
	require.NoError(t, err)
	t.Logf("report: Moved=%d AlreadyMoved=%d Undone=%d Twice=%d Left=%d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Twice), len(rep.Left))
	requireOneMovedOtherRanAndUndone(t, rep, "task", "asynq", &asynqRuns, "jobkey", func(id string) (string, bool) {
		j, err := q.Get(e.ctx, id)
		if err != nil {
			return "", false
		}
		return j.State.String(), true
	})
	require.Equal(t, "gone", rep.Undone[0].State)
}

// MigrateToAsynq moves jobs from a listing that may be stale: a pending job
// that a jobkey worker claims and COMPLETES between the listing and its
// move must not run again in asynq. Before the fix, it was enqueued into
// asynq and Queue.Delete (which refuses only active jobs) deleted the
// succeeded job: the report said Moved=2 and job "b" ran in jobkey AND was
// pending in asynq. Now the delete is DeleteIn(StatePending): the
// succeeded job stays, its asynq copy (still pending) is deleted again, and
// the report says Undone.
func TestMigrateToAsynqStaleListingRunsOnce(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	now := time.Now()
	for i, id := range []string{"a", "b"} {
		_, err := q.Enqueue(e.ctx, moveType, []byte("p-"+id), &jobkey.EnqueueOpts{ID: id, RunAt: now.Add(time.Duration(i-5) * time.Second)})
		require.NoError(t, err)
	}
	var jobkeyRuns sync.Map
	var once sync.Once
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, Concurrency: 1,
		Progress: func(p MigrateProgress) {
			if p.Phase != "moving" || p.Pass != 1 || p.Done != 1 {
				return
			}
			// One job moved; a jobkey worker (running as it always was)
			// takes the other one and finishes it.
			once.Do(func() {
				ctx, stop := context.WithCancel(e.ctx)
				done := make(chan error, 1)
				go func() {
					done <- q.Work(ctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
						n, _ := jobkeyRuns.LoadOrStore(j.ID, new(atomic.Int32))
						n.(*atomic.Int32).Add(1)
						return nil, nil
					}), &jobkey.WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond})
				}()
				require.Eventually(t, func() bool { return count(&jobkeyRuns, "a")+count(&jobkeyRuns, "b") == 1 }, 10*time.Second, 5*time.Millisecond)
				stop()
				<-done
			})
		}})
	require.NoError(t, err)
	t.Logf("report: Moved=%d AlreadyMoved=%d Undone=%d Twice=%d Left=%d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Twice), len(rep.Left))
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	ran := requireOneMovedOtherRanAndUndone(t, rep, "job", "jobkey", &jobkeyRuns, "asynq", func(id string) (string, bool) {
		ti, err := ins.GetTaskInfo("default", id)
		if err != nil {
			return "", false
		}
		return ti.State.String(), true
	})
	j, err := q.Get(e.ctx, ran)
	require.NoError(t, err, "the job jobkey ran is kept")
	require.Equal(t, jobkey.StateSucceeded, j.State)
}

// PauseQueue was not safe for two migrations of one asynq queue at once
// (of the same type, or of two types): run A paused the queue; run B found
// it paused and so would not resume it; A finished and unpaused the queue
// while B was still between enqueue and delete, the window PauseQueue
// promises to close (observed: inside B's move, Paused=false). Now a
// migration holds the asynq queue's migration lock for its whole run: B
// refuses to start with a *MigrationRunningError while A runs, the queue
// stays paused through A's move and is resumed by A alone, and B runs once
// A has finished.
func TestMigrateConcurrentMigrationsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
	require.NoError(t, err)
	_, err = ac.EnqueueContext(e.ctx, asynq.NewTask("email:digest", []byte("y")), asynq.TaskID("y"))
	require.NoError(t, err)
	q := e.queue(t, "emails", nil)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	paused := func() bool {
		qi, err := ins.GetQueueInfo("default")
		require.NoError(t, err)
		return qi.Paused
	}

	inA := make(chan struct{})
	bDone := make(chan struct{})
	aErr := make(chan error, 1)
	var pausedInA atomic.Bool
	go func() { // A moves email:welcome, and waits mid-move for B
		// A lock's TTL of 2s, not less: a loaded machine once kept A's
		// renewals (every third of it) from Redis for 300ms.
		opts := MigrateOpts{Type: moveType, To: q, PauseQueue: true, lockTTL: 2 * time.Second}
		opts.afterEnqueue = func(string) error {
			close(inA)
			<-bDone
			// Past the lock's TTL: A renews it.
			time.Sleep(2500 * time.Millisecond)
			qi, err := ins.GetQueueInfo("default")
			if err == nil {
				pausedInA.Store(qi.Paused)
			}
			return err
		}
		rep, err := Migrate(e.ctx, e.rdb, opts)
		if err == nil && rep.Moved != 1 {
			err = fmt.Errorf("A moved %d tasks", rep.Moved)
		}
		aErr <- err
	}()
	<-inA
	require.True(t, paused())
	// B, of another type of the same asynq queue, and a rollback into it,
	// refuse to start while A runs; a dry run is allowed.
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: "email:digest", To: q, PauseQueue: true})
	var mre *MigrationRunningError
	require.ErrorAs(t, err, &mre)
	require.ErrorIs(t, err, ErrMigrationRunning)
	require.Equal(t, "default", mre.Queue)
	require.NotEmpty(t, mre.Holder)
	_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.ErrorIs(t, err, ErrMigrationRunning)
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{Type: "email:digest", To: q, DryRun: true})
	require.NoError(t, err)
	close(bDone)
	require.NoError(t, <-aErr)
	require.True(t, pausedInA.Load(), "A was between enqueue and delete, with PauseQueue, and the asynq queue was not paused")
	require.False(t, paused(), "A resumed the queue it paused")

	// After A, B runs, and the lock is gone once it has finished.
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: "email:digest", To: q, PauseQueue: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved)
	require.False(t, paused())
	n, err := e.rdb.Exists(e.ctx, lockKey("default")).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

// A migration that loses its lock (here: the key is overwritten, as by a
// second run after the lock expired) stops with ErrLockLost and, having
// paused the queue, leaves it paused rather than unpausing it under the
// other run.
func TestMigrateLockLostStops(t *testing.T) {
	e := newEnv(t)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
	require.NoError(t, err)
	q := e.queue(t, "emails", nil)
	opts := MigrateOpts{Type: moveType, To: q, PauseQueue: true, lockTTL: 150 * time.Millisecond}
	opts.afterEnqueue = func(string) error {
		require.NoError(t, e.rdb.Set(e.ctx, lockKey("default"), "another run", time.Minute).Err())
		time.Sleep(time.Second)
		return nil
	}
	_, err = Migrate(e.ctx, e.rdb, opts)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, "left paused")
	qi, err := asynq.NewInspectorFromRedisClient(e.rdb).GetQueueInfo("default")
	require.NoError(t, err)
	require.True(t, qi.Paused)
	v, err := e.rdb.Get(e.ctx, lockKey("default")).Result()
	require.NoError(t, err)
	require.Equal(t, "another run", v, "the other run's lock is not released by this one")
}

// A task that asynq runs, fails and puts back to wait for a retry between
// Migrate's listing and its move keeps the retries it spent: its move does
// not delete it while its held copy was made from the listing (whose copy
// would give it the spent runs again), but drops that copy, and the next
// pass moves the task as it is then. MaxRetry(1): two runs in all, as
// asynq alone gives it. Before, the copy carried Retried 0 and two
// attempts, and the task ran three times ("0/1" in asynq, "0/1" and "1/1"
// in jobkey): the end-to-end adoption test under load once saw it.
func TestMigrateTaskRetriedSinceItsListingKeepsItsRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("p")),
		asynq.TaskID("r"), asynq.MaxRetry(1))
	require.NoError(t, err)
	var inAsynq []string
	var once sync.Once
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q,
		afterEnqueue: func(string) error {
			// Listed pending, its held copy enqueued: asynq's server runs
			// it now, and it fails and waits a second for its retry.
			once.Do(func() {
				failingAsynq(t, e, &inAsynq, func(int) time.Duration { return time.Second }, taskRetried(e, "r", 1))
			})
			return nil
		}})
	require.NoError(t, err)
	require.Equal(t, []string{"0/1"}, inAsynq)
	require.Equal(t, 1, rep.Moved)
	j, err := q.Get(e.ctx, "r")
	require.NoError(t, err)
	require.Equal(t, "1", j.Meta[MetaRetried], "the retry asynq spent during the move")
	require.Equal(t, 1, j.MaxAttempts)

	var inJobkey []string
	j = work(t, e, q, failingHandler(&inJobkey), "r")["r"]
	require.Equal(t, jobkey.StateFailed, j.State)
	require.Equal(t, []string{"1/1"}, inJobkey)
	require.Equal(t, 1+1, len(inAsynq)+len(inJobkey), "MaxRetry(1): two runs in all, as in asynq")
}
