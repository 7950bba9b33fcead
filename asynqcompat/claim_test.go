package asynqcompat

import (
	"encoding/json"
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

// noneLeft checks that no migration state, lock or claim is left, and
// that no task or job is held at the year 9999.
func noneLeft(t *testing.T, e *env, q *jobkey.Queue, asynqQueues ...string) {
	t.Helper()
	keys := []string{claimKey(q)}
	for _, aq := range asynqQueues {
		keys = append(keys, stateKey(aq), lockKey(aq))
		n, err := e.rdb.ZCount(e.ctx, asynqListKey(aq, "scheduled"), fmt.Sprint(holdUntil.Unix()), "+inf").Result()
		require.NoError(t, err)
		require.Zero(t, n, "asynq queue %q holds no copy", aq)
	}
	n, err := e.rdb.Exists(e.ctx, keys...).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no migration state, lock or claim is left")
	page, err := q.List(e.ctx, jobkey.ListOpts{State: jobkey.StatePending, Limit: jobkey.MaxListLimit})
	require.NoError(t, err)
	for _, j := range page.Jobs {
		require.False(t, j.RunAt.Equal(holdUntil), "job %s is held", j.ID)
	}
}

// A migration from asynq queue A into jobkey queue Q and one from Q back
// to asynq queue B exclude each other: held jobs in Q do not say whose
// move holds them, and a move recovered by one would take the other's.
// Here Migrate(A→Q) was killed with a task's copy held in Q, and
// MigrateToAsynq(Q→B) was killed right after recording a move of that job,
// before it held it (the state is written as such a run leaves it). The
// rerun of Q→B is refused, with the asynq queue to rerun first; after
// that rerun, it finishes, and the task ran once.
func TestOppositeMigrationsOfOneJobkeyQueueExcludeEachOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")),
		asynq.TaskID("x"), asynq.Queue("a"))
	require.NoError(t, err)
	var crashed atomic.Bool
	_, err = Migrate(e.ctx, e.rdb, MigrateOpts{FromQueue: "a", Type: moveType, To: q,
		crashAt: crashOnce(atAfterEnqueue, &crashed), lockTTL: time.Second})
	require.ErrorIs(t, err, errCrash)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err)
	require.True(t, j.RunAt.Equal(holdUntil), "the copy in jobkey is held")

	// The state a MigrateToAsynq(Q→B) leaves when killed between recording
	// its move of x and holding it.
	st, err := json.Marshal(&migState{Moves: map[string]*moveRec{"x": {Dir: dirToAsynq, Step: stepHold,
		JobkeyQueue: q.Name(), Type: moveType, RunAt: time.Now()}}})
	require.NoError(t, err)
	require.NoError(t, e.rdb.Set(e.ctx, stateKey("b"), st, 0).Err())

	var runs sync.Map
	stop := bothOn(t, e, q, &runs, "a", "b")
	defer stop()
	require.Eventually(t, func() bool { return count(&runs, "x") == 1 }, 10*time.Second, 10*time.Millisecond,
		"asynq runs x in A, where it still waits")

	_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, ToQueue: "b", Wait: 2 * time.Second})
	var busy *JobkeyQueueBusyError
	require.ErrorAs(t, err, &busy)
	require.ErrorIs(t, err, ErrJobkeyQueueBusy)
	require.Equal(t, "a", busy.AsynqQueue)
	require.True(t, busy.Unfinished)

	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{FromQueue: "a", Type: moveType, To: q, Wait: 5 * time.Second})
	require.NoError(t, err)
	require.Len(t, rep.Undone, 1, "x ran in A: its held copy goes")
	_, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, ToQueue: "b"})
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 1, count(&runs, "x"), "x ran once")
	noneLeft(t, e, q, "a", "b")
}

// Both directions at once on one jobkey queue, each killed at a step of a
// move and rerun at the same time, with every system's workers running:
// each run waits for the other, every task and job runs exactly once, and
// nothing is left held, paused, locked or claimed.
func TestOppositeMigrationsAtOnceRunEachTaskOnce(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"", atAfterEnqueue, atAfterReread, atAfterDelete} {
		t.Run(fmt.Sprintf("crash=%q", point), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			q := e.queue(t, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			ac := asynq.NewClientFromRedisClient(e.rdb)
			var ids []string
			var specs []jobkey.JobSpec
			later := time.Now().Add(time.Second)
			for i := range 60 {
				id := fmt.Sprintf("a-%d", i)
				ids = append(ids, id)
				_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id), asynq.Queue("a"), asynq.ProcessAt(later))
				require.NoError(t, err)
				id = fmt.Sprintf("q-%d", i)
				ids = append(ids, id)
				specs = append(specs, jobkey.JobSpec{Type: moveType, Payload: []byte(id), Opts: &jobkey.EnqueueOpts{ID: id, RunAt: later}})
			}
			_, err := q.EnqueueMany(e.ctx, specs)
			require.NoError(t, err)
			var runs sync.Map
			stop := bothOn(t, e, q, &runs, "a", "b")
			defer stop()

			var wg sync.WaitGroup
			var errA, errB error
			if point != "" {
				var crashedA, crashedB atomic.Bool
				wg.Add(2)
				go func() {
					defer wg.Done()
					_, errA = Migrate(e.ctx, e.rdb, MigrateOpts{FromQueue: "a", Type: moveType, To: q, Concurrency: 4,
						crashAt: crashOnce(point, &crashedA), lockTTL: time.Second})
				}()
				go func() {
					defer wg.Done()
					_, errB = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, ToQueue: "b", Concurrency: 4,
						crashAt: crashOnce(point, &crashedB), lockTTL: time.Second})
				}()
				wg.Wait()
				for _, err := range []error{errA, errB} {
					if err != nil && !errors.Is(err, errCrash) {
						require.ErrorIs(t, err, ErrJobkeyQueueBusy, "the other direction held the jobkey queue")
					}
				}
			}
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, errA = Migrate(e.ctx, e.rdb, MigrateOpts{FromQueue: "a", Type: moveType, To: q, Wait: 20 * time.Second})
			}()
			go func() {
				defer wg.Done()
				_, errB = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType, ToQueue: "b", Wait: 20 * time.Second})
			}()
			wg.Wait()
			require.NoError(t, errA)
			require.NoError(t, errB)
			ranOnce(t, &runs, ids)
			noneLeft(t, e, q, "a", "b")
		})
	}
}
