package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/asynqcompat"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// migrate-asynq and migrate-to-asynq on a real Redis: a dry run writes
// nothing, the move prints what it moved and skipped, and the rollback
// brings the tasks back.
func TestMigrateAsynqCommands(t *testing.T) {
	s := redistest.Start(t, redistest.Options{}) // asynq's keys have a fixed prefix: a server of its own
	rdb := redistest.ClientFor(t, s.URL(), nil)
	ctx := context.Background()
	ac := asynq.NewClientFromRedisClient(rdb)
	ins := asynq.NewInspectorFromRedisClient(rdb)
	for i := range 40 {
		typ := "email:welcome"
		if i%4 == 0 {
			typ = "image:resize"
		}
		_, err := ac.Enqueue(asynq.NewTask(typ, fmt.Appendf(nil, "p-%d", i)), asynq.TaskID(fmt.Sprintf("t-%d", i)))
		require.NoError(t, err)
	}
	_, err := ac.Enqueue(asynq.NewTask("email:welcome", []byte("b")), asynq.TaskID("bad{x}"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	var out, errOut bytes.Buffer
	args := []string{"migrate-asynq", "-redis", s.URL(), "-from-queue", "default", "-type", "email:welcome", "-to", "emails"}
	require.ErrorIs(t, run(ctx, append(args, "-dry-run"), &out, &errOut), errMigrateUnfinished, "the dry run sees the task it would skip")
	require.Contains(t, out.String(), "dry run: 30 tasks would move")
	qi, err := ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.Equal(t, 40, qi.Pending)

	out.Reset()
	err = run(ctx, append(args, "-pause"), &out, &errOut)
	require.ErrorIs(t, err, errMigrateUnfinished, "a skipped task makes the command exit non-zero")
	require.Contains(t, out.String(), "moved 30 tasks from asynq queue \"default\" to jobkey queue \"emails\"")
	require.Contains(t, out.String(), "| bad{x} | scheduled | task ID contains '{' or '}'")
	require.Contains(t, errOut.String(), "pass 1: moving")
	qi, err = ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.Equal(t, 10, qi.Pending)
	require.False(t, qi.Paused, "-pause resumes the queue afterwards")
	q, err := jobkey.NewQueue(rdb, "emails", nil)
	require.NoError(t, err)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 30, st.Pending)

	// The rollback.
	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate-to-asynq", "-redis", s.URL(), "-from", "emails", "-type", "email:welcome", "-to-queue", "default"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "moved 30 tasks from jobkey queue \"emails\" to asynq queue \"default\"")
	st, err = q.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending)
	qi, err = ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.Equal(t, 40, qi.Pending)
	ti, err := ins.GetTaskInfo("default", "t-1")
	require.NoError(t, err)
	require.Equal(t, "p-1", string(ti.Payload))

	// A second migration of the same asynq queue is refused while one holds
	// its lock, in either direction.
	require.NoError(t, rdb.Set(ctx, "asynqcompat:migrate-lock:default", "another run", time.Minute).Err())
	err = run(ctx, args, &out, &errOut)
	require.ErrorIs(t, err, asynqcompat.ErrMigrationRunning)
	require.ErrorContains(t, err, "migrate-asynq refused")
	require.ErrorContains(t, err, "another run")
	err = run(ctx, []string{"migrate-to-asynq", "-redis", s.URL(), "-from", "emails", "-type", "email:welcome", "-to-queue", "default"}, &out, &errOut)
	require.ErrorIs(t, err, asynqcompat.ErrMigrationRunning)
	require.NoError(t, rdb.Del(ctx, "asynqcompat:migrate-lock:default").Err())

	// Bad flags.
	require.ErrorContains(t, run(ctx, []string{"migrate-asynq", "-redis", s.URL(), "-to", "emails"}, &out, &errOut), "-type is required")
}
