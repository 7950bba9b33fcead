package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/asynqcompat"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
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
	require.Contains(t, out.String(), "dry run: 30 tasks of type \"email:welcome\" would move")
	qi, err := ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.Equal(t, 40, qi.Pending)

	out.Reset()
	err = run(ctx, append(args, "-pause"), &out, &errOut)
	require.ErrorIs(t, err, errMigrateUnfinished, "a skipped task makes the command exit non-zero")
	require.Contains(t, out.String(), "moved 30 tasks of type \"email:welcome\" from asynq queue \"default\" to jobkey queue \"emails\"")
	require.Contains(t, out.String(), "| bad{x} | scheduled | task ID contains '{' or '}'")
	require.NotContains(t, errOut.String(), "pass 1: moving", "no progress bar when stderr is not a terminal")
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
	require.Contains(t, out.String(), "moved 30 tasks of type \"email:welcome\" from jobkey queue \"emails\" to asynq queue \"default\"")
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
	t.Parallel()
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
	q, err := jobkey.NewQueue(rdb, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	requireKilledMigrationRerunRunsEachOnce(t, ctx, rdb, q, asynq.Config{},
		"migrate-asynq -redis "+s.URL()+" -from-queue default -type email:welcome -to emails", "task", ids)
}

// migrate-to-asynq -pause killed with SIGKILL mid-run, while asynq's
// server and jobkey's workers both run, then run again with -wait: every
// job runs exactly once, in one system or the other, the queue the killed
// run paused is resumed, and nothing is left held in either system.
func TestMigrateToAsynqKilledAndRerunRunsEachJobOnce(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{})
	rdb := redistest.ClientFor(t, s.URL(), nil)
	ctx := context.Background()
	q, err := jobkey.NewQueue(rdb, "emails", &jobkey.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	const n = 2000
	ids := make([]string, n)
	var specs []jobkey.JobSpec
	// Due after the killed run's lock expires: the rerun has jobs to move.
	later := time.Now().Add(9 * time.Second)
	for i := range n {
		ids[i] = fmt.Sprintf("j-%d", i)
		specs = append(specs, jobkey.JobSpec{Type: "email:welcome", Payload: []byte(ids[i]), Opts: &jobkey.EnqueueOpts{ID: ids[i], RunAt: later}})
	}
	_, err = q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	// asynq knows the queue: it has held a task.
	_, err = asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("other", nil), asynq.TaskID("other"))
	require.NoError(t, err)
	requireKilledMigrationRerunRunsEachOnce(t, ctx, rdb, q, asynq.Config{DelayedTaskCheckInterval: 100 * time.Millisecond},
		"migrate-to-asynq -redis "+s.URL()+" -to-queue default -type email:welcome -from emails", "job", ids)
	held, err := rdb.ZCount(ctx, "asynq:{default}:scheduled", "253370764800", "+inf").Result()
	require.NoError(t, err)
	require.Zero(t, held, "no asynq copy is left held")
	n2, err := rdb.Exists(ctx, "asynqcompat:{default}:migration", "asynqcompat:{default}:migrate-lock", "asynqcompat:jobkey:{jobkey/emails}:migration").Result()
	require.NoError(t, err)
	require.Zero(t, n2, "no migration state, lock or claim is left")
}

// requireKilledMigrationRerunRunsEachOnce runs asynq's server (cfg) and
// jobkey's workers on q while the migration command args is killed mid-run
// and run again, then requires every ID in ids (what: "task" or "job") to
// have run exactly once, in one system or the other, and asynq's queue
// "default", which the killed run paused, to be resumed.
func requireKilledMigrationRerunRunsEachOnce(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *jobkey.Queue, cfg asynq.Config, args, what string, ids []string) {
	t.Helper()
	runs := runBothSystems(t, ctx, rdb, q, cfg)
	killMidMigrationAndRerun(t, ctx, rdb, args)
	runs.waitFor(len(ids), 60*time.Second)
	runs.requireEachOnce(t, what, ids)
	qi, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo("default")
	require.NoError(t, err)
	require.False(t, qi.Paused, "the rerun resumed the queue the killed run paused")
}

// runCounts counts the runs of each task or job ID, in either system.
type runCounts struct{ m sync.Map }

func (c *runCounts) hit(id string) {
	v, _ := c.m.LoadOrStore(id, new(atomic.Int32))
	v.(*atomic.Int32).Add(1)
	time.Sleep(time.Millisecond)
}

// waitFor waits until at least n distinct IDs have run or timeout passes,
// then a little longer for any second run to show.
func (c *runCounts) waitFor(n int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		done := 0
		c.m.Range(func(_, _ any) bool { done++; return true })
		if done >= n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
}

// requireEachOnce fails unless every ID in ids ran exactly once; what names
// them ("task", "job") in the message.
func (c *runCounts) requireEachOnce(t *testing.T, what string, ids []string) {
	t.Helper()
	for _, id := range ids {
		v, ok := c.m.Load(id)
		got := 0
		if ok {
			got = int(v.(*atomic.Int32).Load())
		}
		require.Equal(t, 1, got, "%s %s ran %d times (0: lost or stuck)", what, id, got)
	}
}

// runBothSystems runs asynq's server (cfg, with four workers) on rdb and
// jobkey's workers on q, four each, until the test ends, and counts every
// run of either by task or job ID.
func runBothSystems(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *jobkey.Queue, cfg asynq.Config) *runCounts {
	t.Helper()
	runs := new(runCounts)
	cfg.Concurrency, cfg.LogLevel = 4, asynq.FatalLevel
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		runs.hit(id)
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	wctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() {
		_ = q.Work(wctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
			runs.hit(j.ID)
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 4, PollInterval: 10 * time.Millisecond})
	}()
	return runs
}

// killMidMigrationAndRerun runs the command args with -pause in a child
// process, kills it with SIGKILL once its moves are under way, then runs
// args again in this process with -wait and requires it to succeed.
func killMidMigrationAndRerun(t *testing.T, ctx context.Context, rdb redis.UniversalClient, args string) {
	t.Helper()
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
}

// migrateEnv is a Redis of its own (asynq's keys have a fixed prefix) with
// tasks of two types in asynq's queue "default".
func migrateEnv(t *testing.T, perType int) (url string, rdb redis.UniversalClient) {
	t.Helper()
	s := redistest.Start(t, redistest.Options{})
	rdb = redistest.ClientFor(t, s.URL(), nil)
	ac := asynq.NewClientFromRedisClient(rdb)
	for i := range perType {
		for _, typ := range []string{"email:welcome", "image:resize"} {
			_, err := ac.Enqueue(asynq.NewTask(typ, nil), asynq.TaskID(fmt.Sprintf("%s-%d", typ, i)))
			require.NoError(t, err)
		}
	}
	return s.URL(), rdb
}

// A -type that matches nothing (no task in the asynq queue, no job in the
// jobkey queue) and a source queue that does not exist are refused, each
// with its exit code, and nothing is written; a type that matches only
// jobs already moved is not a mistake.
func TestMigrateCommandsRefuseNamesThatMatchNothing(t *testing.T) {
	t.Parallel()
	url, rdb := migrateEnv(t, 3)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	keys := func() []string {
		ks, err := rdb.Keys(ctx, "*").Result()
		require.NoError(t, err)
		slices.Sort(ks)
		return ks
	}
	before := keys()

	err := run(ctx, []string{"migrate-asynq", "-redis", url, "-type", "email:welcom", "-to", "emails"}, &out, &errOut)
	require.Equal(t, exitRefused, exitCode(err), "a mistyped -type: %v", err)
	require.ErrorContains(t, err, `"email:welcom"`)
	require.NotContains(t, out.String(), "moved 0")
	err = run(ctx, []string{"migrate-asynq", "-redis", url, "-type", "email:welcome,image:resise", "-to", "emails"}, &out, &errOut)
	require.Equal(t, exitRefused, exitCode(err), "one mistyped type of two refuses the run before it moves any: %v", err)
	err = run(ctx, []string{"migrate-asynq", "-redis", url, "-from-queue", "defualt", "-type", "email:welcome", "-to", "emails"}, &out, &errOut)
	require.Equal(t, exitNoQueue, exitCode(err), "an asynq queue that does not exist: %v", err)
	err = run(ctx, []string{"migrate-to-asynq", "-redis", url, "-from", "emials", "-type", "email:welcome"}, &out, &errOut)
	require.Equal(t, exitNoQueue, exitCode(err), "a jobkey queue that does not exist: %v", err)
	require.ErrorContains(t, err, `jobkey queue "emials"`)
	require.Equal(t, before, keys(), "a refused run writes nothing")

	// Moved, then asked again: the jobs in jobkey are the type's, and the
	// rerun moves nothing, successfully.
	require.NoError(t, run(ctx, []string{"migrate-asynq", "-redis", url, "-type", "email:welcome", "-to", "emails"}, &out, &errOut))
	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate-asynq", "-redis", url, "-type", "email:welcome", "-to", "emails"}, &out, &errOut))
	require.Contains(t, out.String(), "moved 0 tasks")
	// And back: the same for the rollback, whose type is then in asynq only.
	require.NoError(t, run(ctx, []string{"migrate-to-asynq", "-redis", url, "-type", "email:welcome", "-from", "emails"}, &out, &errOut))
	require.NoError(t, run(ctx, []string{"migrate-to-asynq", "-redis", url, "-type", "email:welcome", "-from", "emails"}, &out, &errOut))
	err = run(ctx, []string{"migrate-to-asynq", "-redis", url, "-type", "email:welcom", "-from", "emails"}, &out, &errOut)
	require.Equal(t, exitRefused, exitCode(err), "a mistyped -type back: %v", err)
}

// Each outcome of a migration exits with its own code, from the process
// itself, in both directions: all moved 0, a stop 1, bad flags or a type
// that matches nothing 2, tasks skipped by design 3, the lock held by
// another run 4, a missing queue 5, a task run by both systems 6, the
// jobkey queue held by a migration through another asynq queue 7.
func TestMigrateCommandsExitCodes(t *testing.T) {
	t.Parallel()
	url, rdb := migrateEnv(t, 2)
	ctx := context.Background()
	ac := asynq.NewClientFromRedisClient(rdb)
	_, err := ac.Enqueue(asynq.NewTask("email:welcome", nil), asynq.TaskID("bad{x}"))
	require.NoError(t, err)
	exit := func(args string) int {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS="+args)
		out, err := cmd.CombinedOutput()
		if err == nil {
			return 0
		}
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", out)
		return ee.ExitCode()
	}
	base := "migrate-asynq -redis " + url + " -to emails "
	back := "migrate-to-asynq -redis " + url + " -from emails "
	lock := "asynqcompat:{default}:migrate-lock"

	require.Equal(t, exitRefused, exit(base))
	require.Equal(t, exitRefused, exit(base+"-type a,,b"))
	require.Equal(t, exitRefused, exit(base+"-type a,a"))
	require.Equal(t, exitRefused, exit(base+"-type nosuch"))
	require.Equal(t, exitRefused, exit(base+"-type email:welcome -nosuchflag"), "an unknown flag is a refusal too")
	require.Equal(t, exitNoQueue, exit(base+"-type email:welcome -from-queue nosuch"))
	require.Equal(t, exitNoQueue, exit("migrate-to-asynq -redis "+url+" -from nosuch -type email:welcome"))
	require.NoError(t, rdb.Set(ctx, lock, "another run", time.Minute).Err())
	require.Equal(t, exitLocked, exit(base+"-type email:welcome"))
	require.NoError(t, rdb.Del(ctx, lock).Err())
	require.Equal(t, exitLeft, exit(base+"-type email:welcome"), "the task with '{' in its ID stays in asynq")
	require.Equal(t, exitMigrated, exit(base+"-type image:resize"))

	// The way back.
	require.Equal(t, exitRefused, exit(back))
	require.Equal(t, exitRefused, exit(back+"-type nosuch"))
	require.NoError(t, rdb.Set(ctx, lock, "another run", time.Minute).Err())
	require.Equal(t, exitLocked, exit(back+"-type image:resize"))
	require.NoError(t, rdb.Del(ctx, lock).Err())
	q, err := jobkey.NewQueue(rdb, "emails", nil)
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "image:resize", nil, &jobkey.EnqueueOpts{ID: "prio", Priority: 3})
	require.NoError(t, err)
	require.Equal(t, exitLeft, exit(back+"-type image:resize"), "a job with a Priority stays in jobkey")
	require.NoError(t, q.Delete(ctx, "prio"))
	require.Equal(t, exitMigrated, exit(back+"-type image:resize,email:welcome -pause"))

	// A task run by both systems: the state a killed migration into asynq
	// leaves after writing the held asynq copy, when someone then ran that
	// copy by hand in asynq and also made the held jobkey job due, where it
	// ran. The rerun, in either direction, finds it and lists it.
	_, err = q.Enqueue(ctx, "email:twice", []byte("u"), &jobkey.EnqueueOpts{ID: "u1"})
	require.NoError(t, err)
	j, err := q.Claim(ctx, "test")
	require.NoError(t, err)
	require.Equal(t, "u1", j.ID)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err)
	forged := fmt.Sprintf(`{"moves":{"u1":{"dir":"to-asynq","step":"copied","jobkey_queue":"emails","type":"email:twice","run_at":%q}}}`,
		time.Now().UTC().Format(time.RFC3339Nano))
	for _, cmd := range []string{base, back} {
		require.NoError(t, rdb.Set(ctx, "asynqcompat:{default}:migration", forged, 0).Err())
		require.Equal(t, exitTwice, exit(cmd+"-type email:twice"), cmd)
	}

	// The jobkey queue held by a migration through another asynq queue,
	// in either direction.
	require.NoError(t, rdb.Set(ctx, "asynqcompat:{other}:migrate-lock", "another run", time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, "asynqcompat:jobkey:{jobkey/emails}:migration", "other", 0).Err())
	require.Equal(t, exitBusy, exit(base+"-type image:resize"))
	require.Equal(t, exitBusy, exit(back+"-type image:resize"))

	// A run stopped by its context, both ways.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	var out, errOut bytes.Buffer
	require.NoError(t, rdb.Del(ctx, "asynqcompat:{other}:migrate-lock").Err())
	err = run(cctx, strings.Fields(base+"-type image:resize"), &out, &errOut)
	require.Equal(t, exitStopped, exitCode(err), "%v", err)
	err = run(cctx, strings.Fields(back+"-type image:resize"), &out, &errOut)
	require.Equal(t, exitStopped, exitCode(err), "%v", err)
}

// -json prints the report as one JSON object, for every type, with the exit
// code; more than one type moves in one run; without a terminal on stderr
// no progress bar is drawn; migrate-to-asynq takes -pause, and resumes the
// queue when done.
func TestMigrateCommandsJSONAndTypes(t *testing.T) {
	t.Parallel()
	url, rdb := migrateEnv(t, 4)
	ctx := context.Background()
	ac := asynq.NewClientFromRedisClient(rdb)
	_, err := ac.Enqueue(asynq.NewTask("image:resize", nil), asynq.TaskID("bad{x}"))
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	err = run(ctx, []string{"migrate-asynq", "-redis", url, "-type", "email:welcome, image:resize", "-to", "emails", "-json", "-pause"}, &out, &errOut)
	require.Equal(t, exitLeft, exitCode(err), "%v", err)
	require.Empty(t, errOut.String(), "no progress bar on a stderr that is not a terminal")
	var rep migrateJSON
	dec := json.NewDecoder(&out)
	require.NoError(t, dec.Decode(&rep), "one JSON object")
	require.False(t, dec.More(), "only one")
	require.Equal(t, "migrate-asynq", rep.Command)
	require.Equal(t, exitLeft, rep.ExitCode)
	require.Contains(t, rep.Error, "did not move")
	require.Len(t, rep.Types, 2)
	require.Equal(t, "email:welcome", rep.Types[0].Type)
	require.Equal(t, 4, rep.Types[0].Moved)
	require.Equal(t, "image:resize", rep.Types[1].Type)
	require.Equal(t, 4, rep.Types[1].Moved)
	require.Equal(t, []noteJSON{{ID: "bad{x}", State: "pending", Reason: rep.Types[1].Skipped[0].Reason}}, rep.Types[1].Skipped)

	q, err := jobkey.NewQueue(rdb, "emails", nil)
	require.NoError(t, err)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 8, st.Pending)

	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate-to-asynq", "-redis", url, "-type", "image:resize,email:welcome", "-from", "emails", "-json", "-pause"}, &out, &errOut))
	rep = migrateJSON{}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Equal(t, exitMigrated, rep.ExitCode)
	require.Equal(t, 4, rep.Types[0].Moved)
	require.Equal(t, 4, rep.Types[1].Moved)
	qi, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo("default")
	require.NoError(t, err)
	require.Equal(t, 9, qi.Pending)
	require.False(t, qi.Paused, "-pause resumes the queue afterwards")
}
