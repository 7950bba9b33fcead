package asynqcompat

import (
	"testing"

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
