package asynqcompat

import (
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
// operator unpaused it still pauses the queue for its moves, and resumes
// it at the end.
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
	_, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true, lockTTL: time.Second,
		crashAt: crashOnce(atAfterEnqueue, &crashed)})
	require.ErrorIs(t, err, errCrash)
	require.True(t, paused())
	require.NoError(t, ins.UnpauseQueue("default"))
	var pausedMidMove atomic.Bool
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: moveType, To: q, PauseQueue: true, Wait: 5 * time.Second,
		afterEnqueue: func(string) error { pausedMidMove.Store(paused()); return nil }})
	require.NoError(t, err)
	require.Equal(t, 2, rep.Moved+rep.AlreadyMoved)
	require.True(t, pausedMidMove.Load(), "the rerun with PauseQueue moved a task with the queue not paused")
	require.False(t, paused(), "the rerun resumes the queue it paused")
}
