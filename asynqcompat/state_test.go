package asynqcompat

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// A migration state value that decodes but says nothing a run could act
// on (a move recorded as null, a direction or step no run writes) is
// reported as unreadable and kept as it is, and the run moves nothing: it
// never panics, and never takes a made-up step for a real one (a step
// "bogus" into jobkey would make the held copy due while the asynq task
// still waits, and the task would run in both).
func TestMigrateKeepsAndReportsAForgedState(t *testing.T) {
	t.Parallel()
	forged := map[string]string{
		"null move":    `{"moves":{"x":null}}`,
		"bad step":     `{"moves":{"x":{"dir":"to-jobkey","step":"bogus","jobkey_queue":"emails","type":"move:me"}}}`,
		"swapped step": `{"moves":{"x":{"dir":"to-asynq","step":"release","jobkey_queue":"emails","type":"move:me"}}}`,
		"bad dir":      `{"moves":{"x":{"dir":"sideways","step":"enqueue","jobkey_queue":"emails","type":"move:me"}}}`,
	}
	for name, val := range forged {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			q := e.queue(t, "emails", nil)
			_, err := asynq.NewClientFromRedisClient(e.rdb).EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
			require.NoError(t, err)
			_, err = q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil})
			require.NoError(t, err)
			require.NoError(t, e.rdb.Set(e.ctx, stateKey("default"), val, 0).Err())

			for _, run := range []func() error{
				func() error { _, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q}); return err },
				func() error {
					_, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{Type: moveType, From: q})
					return err
				},
			} {
				require.NotPanics(t, func() { err = run() })
				require.ErrorIs(t, err, ErrStateUnreadable)
			}
			got, err := e.rdb.Get(e.ctx, stateKey("default")).Result()
			require.NoError(t, err)
			require.Equal(t, val, got, "the state value is kept as it is")
			j, err := q.Get(e.ctx, "x")
			require.NoError(t, err)
			require.True(t, j.RunAt.Equal(holdUntil), "the held jobkey copy stays held")
			require.Contains(t, allTasks(t, asynq.NewInspectorFromRedisClient(e.rdb), "default"), "x", "the asynq task stays")
		})
	}
}

// An operator who unpauses a queue a migration paused, and pauses it again
// while the migration runs, keeps that pause: the migration resumes only a
// pause it made itself.
func TestMigrateKeepsAnOperatorsPauseMadeDuringTheRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte("x")), asynq.TaskID("x"))
	require.NoError(t, err)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	opts := MigrateOpts{Type: moveType, To: q, PauseQueue: true}
	opts.afterEnqueue = func(string) error {
		require.NoError(t, ins.UnpauseQueue("default"))
		time.Sleep(1100 * time.Millisecond) // a later second: asynq's pause records it
		require.NoError(t, ins.PauseQueue("default"))
		return nil
	}
	rep, err := Migrate(e.ctx, e.rdb, opts)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved)
	qi, err := ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.True(t, qi.Paused, "the operator's pause, made during the run, stays")
}

// A rerun with PauseQueue after a killed run paused the queue and an
// operator unpaused it pauses the queue again before it moves anything,
// the move the killed run left included, and resumes it at the end: every
// step of every move of the rerun, finished or fresh, finds the queue
// paused. The killed run moves one task at a time, so that it stops in the
// first task's move and leaves the second untouched, whatever the load.
// Its earlier form, eight moves at a time and a check of fresh moves only,
// failed about one run in thirty: the killed run had left both tasks'
// moves, and the rerun finished both before it paused the queue.
func TestMigrateRerunPausesAQueueUnpausedSinceTheCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for _, id := range []string{"a", "b"} {
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id))
		require.NoError(t, err)
	}
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	paused := func() bool {
		qi, err := ins.GetQueueInfo("default")
		require.NoError(t, err)
		return qi.Paused
	}
	var crashed atomic.Bool
	_, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true, Concurrency: 1, lockTTL: time.Second,
		crashAt: crashOnce(atAfterEnqueue, &crashed)})
	require.ErrorIs(t, err, errCrash)
	require.True(t, paused())
	require.NoError(t, ins.UnpauseQueue("default"))

	var mu sync.Mutex
	steps := map[string][]string{} // per task, the steps of the rerun's move that found the queue not paused
	seen := map[string]int{}
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true, Wait: 5 * time.Second,
		crashAt: func(point, id string) error {
			n, err := e.rdb.Exists(e.ctx, asynqPausedKey("default")).Result()
			mu.Lock()
			defer mu.Unlock()
			seen[id]++
			if err != nil || n == 0 {
				steps[id] = append(steps[id], point)
			}
			return nil
		}})
	require.NoError(t, err)
	require.Equal(t, 1, rep.AlreadyMoved, "the move the killed run left")
	require.Equal(t, 1, rep.Moved, "the task the killed run did not touch")
	require.Len(t, seen, 2, "both moves passed their steps")
	require.Empty(t, steps, "steps of the rerun's moves that ran with the queue not paused")
	require.False(t, paused(), "the rerun resumes the queue it paused")
}
