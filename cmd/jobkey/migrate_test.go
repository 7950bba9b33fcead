package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
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
	require.NoError(t, rdb.Set(ctx, "asynqcompat:{default}:migrate-lock", "another run", time.Minute).Err())
	err = run(ctx, args, &out, &errOut)
	require.ErrorIs(t, err, asynqcompat.ErrMigrationRunning)
	require.ErrorContains(t, err, "migrate-asynq refused")
	require.ErrorContains(t, err, "another run")
	err = run(ctx, []string{"migrate-to-asynq", "-redis", s.URL(), "-from", "emails", "-type", "email:welcome", "-to-queue", "default"}, &out, &errOut)
	require.ErrorIs(t, err, asynqcompat.ErrMigrationRunning)
	require.NoError(t, rdb.Del(ctx, "asynqcompat:{default}:migrate-lock").Err())

	// Bad flags.
	require.ErrorContains(t, run(ctx, []string{"migrate-asynq", "-redis", s.URL(), "-to", "emails"}, &out, &errOut), "-type is required")
}

// migrate-asynq -pause killed with SIGKILL mid-run, while asynq's server
// and jobkey's workers both run, then run again (with -wait, without
// -pause): every task runs exactly once, in one system or the other, and
// the queue the killed run paused is resumed.
func TestMigrateAsynqKilledAndRerunRunsEachTaskOnce(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	rdb := redistest.ClientFor(t, s.URL(), nil)
	ctx := context.Background()
	ac := asynq.NewClientFromRedisClient(rdb)
	const n = 3000
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("t-%d", i)
		_, err := ac.Enqueue(asynq.NewTask("email:welcome", []byte(ids[i])), asynq.TaskID(ids[i]))
		require.NoError(t, err)
	}
	var runs sync.Map
	hit := func(id string) {
		c, _ := runs.LoadOrStore(id, new(atomic.Int32))
		c.(*atomic.Int32).Add(1)
		time.Sleep(time.Millisecond)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 4, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		hit(id)
		return nil
	})))
	defer srv.Shutdown()
	q, err := jobkey.NewQueue(rdb, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = q.Work(wctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
			hit(j.ID)
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 4, PollInterval: 10 * time.Millisecond})
	}()

	args := "migrate-asynq -redis " + s.URL() + " -from-queue default -type email:welcome -to emails"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS="+args+" -pause")
	require.NoError(t, cmd.Start())
	// Kill it once it has moves under way.
	require.Eventually(t, func() bool {
		v, err := rdb.Get(ctx, "asynqcompat:{default}:migration").Result()
		return err == nil && strings.Contains(v, `"moves"`)
	}, 20*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	state, _ := rdb.Get(ctx, "asynqcompat:{default}:migration").Result()
	t.Logf("state left by the killed run: %.300s", state)

	var out, errOut bytes.Buffer
	require.NoError(t, run(ctx, append(strings.Fields(args), "-wait", "20s"), &out, &errOut), "%s\n%s", out.String(), errOut.String())
	t.Logf("rerun: %s", strings.SplitN(out.String(), "\n", 2)[0])
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		done := 0
		runs.Range(func(_, _ any) bool { done++; return true })
		if done == n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	for _, id := range ids {
		c, ok := runs.Load(id)
		got := 0
		if ok {
			got = int(c.(*atomic.Int32).Load())
		}
		require.Equal(t, 1, got, "task %s ran %d times (0: lost or stuck)", id, got)
	}
	qi, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo("default")
	require.NoError(t, err)
	require.False(t, qi.Paused, "the rerun resumed the queue the killed run paused")
}
