package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// splitCluster is a cluster of three masters with a replica each, on which
// the asynq queues a test names (asyncQueue) sit on one master, aMaster,
// and the jobkey queues' claims and the jobs of the IDs it picks (ids) on
// the others: a move writes to two masters, as on a cluster in use.
type splitCluster struct {
	cl       *redistest.Cluster
	rdb      *redis.ClusterClient
	ctx      context.Context
	aMaster  *redistest.Server
	aReplica *redistest.Server
}

func setupSplit(t *testing.T) *splitCluster {
	t.Helper()
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	s := &splitCluster{cl: cl, rdb: cl.Client(t, func(o *redis.ClusterOptions) { o.PoolSize = 32 })}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	// Not the master of asynq:queues, which a move into asynq writes
	// beside the queue's own keys.
	queues := s.masterOf(t, "asynq:queues")
	for _, m := range cl.Masters() {
		if m.Addr != queues {
			s.aMaster = m
			break
		}
	}
	require.NotNil(t, s.aMaster)
	s.aReplica = cl.ReplicaOf(s.aMaster)
	require.NotNil(t, s.aReplica)
	t.Cleanup(func() { _ = s.aReplica.Thaw() })
	return s
}

// masterOf returns the address of the master that serves key.
func (s *splitCluster) masterOf(t *testing.T, key string) string {
	t.Helper()
	c, err := s.rdb.MasterForKey(s.ctx, key)
	require.NoError(t, err)
	return c.Options().Addr
}

// asynqQueue names an asynq queue, from n up, whose keys sit on aMaster.
func (s *splitCluster) asynqQueue(t *testing.T, n int) string {
	t.Helper()
	for i := n; ; i++ {
		name := fmt.Sprintf("mig%d", i)
		if s.masterOf(t, asynqTaskKey(name, "x")) == s.aMaster.Addr {
			return name
		}
	}
}

// queue returns a jobkey queue, named from name, whose claim is off
// aMaster, with writes that wait for one replica. A second is long for a
// replica that runs, and short enough for one that is frozen to be found
// at once.
func (s *splitCluster) queue(t *testing.T, name string) *jobkey.Queue {
	t.Helper()
	prefix := redistest.Prefix(t)
	for i := 0; ; i++ {
		q, err := jobkey.NewQueue(s.rdb, fmt.Sprintf("%s%d", name, i), &jobkey.Config{Prefix: prefix,
			MinReplicas: 1, ReplicaTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		if s.masterOf(t, claimKey(q)) != s.aMaster.Addr {
			return q
		}
	}
}

// ids returns n task IDs whose jobkey jobs in q sit off aMaster.
func (s *splitCluster) ids(t *testing.T, q *jobkey.Queue, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("t%d", i)
		if s.masterOf(t, q.Keys(id).Job) != s.aMaster.Addr {
			out = append(out, id)
		}
	}
	return out
}

// untilReplicatedRun reruns a migration while it stops on a write its
// replicas did not confirm: a replica just thawed on a loaded machine may
// take longer than the short ReplicaTimeout to catch up.
func untilReplicatedRun(t *testing.T, run func() (MigrateReport, error)) (MigrateReport, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep, err := run()
		if !errors.Is(err, ErrNotReplicated) || time.Now().After(deadline) {
			return rep, err
		}
		t.Logf("a rerun stopped (moved %d, finished %d, undone %d): %v", rep.Moved, rep.AlreadyMoved, len(rep.Undone), err)
	}
}

// untilFrozen reruns a migration that stopped on a write its replicas did
// not confirm before the test froze the replica: on a loaded machine, a
// replica that runs may be slower than ReplicaTimeout. It returns the
// reports' counts of moved tasks summed, in the last report.
func untilFrozen(t *testing.T, frozen *atomic.Bool, run func() (MigrateReport, error)) (MigrateReport, error) {
	t.Helper()
	moved := 0
	for {
		rep, err := run()
		moved += rep.Moved + rep.AlreadyMoved
		if frozen.Load() || !errors.Is(err, ErrNotReplicated) {
			rep.Moved, rep.AlreadyMoved = moved, 0
			return rep, err
		}
		t.Logf("a write before the replica was frozen was not confirmed in time; rerun: %v", err)
	}
}

// Each write a move makes to asynq's keys and its state waits for the
// replicas of the master that applied it, which is not the jobkey queue's:
// with the asynq queue's replica frozen at a step of a move, the next such
// write stops the run with a *ReplicationError that names the task and the
// write, where the jobkey queue's own writes, confirmed by their replicas,
// go through. MinReplicas is the jobkey queue's, taken by default. Once
// the replica is back, a rerun finishes the move: the task is in exactly
// one system. Before, the writes were acknowledged without WAIT, and each
// run reported success.
func TestMigrationWritesWaitForTheAsynqQueuesReplicas(t *testing.T) {
	t.Parallel()
	s := setupSplit(t)
	for i, c := range []struct {
		intoAsynq bool
		at        string // the step at which the replica freezes; "" before the run
		write     string
	}{
		{false, "", "record the move"},
		{false, atAfterReread, "delete the waiting asynq task"},
		{false, atAfterRelease, "forget the ended move"},
		{true, atBeforeEnqueue, "write the held asynq copy"},
		{true, atAfterEnqueue, "make the held asynq copy due"},
		{true, atAfterDelete, "forget the ended move"},
	} {
		into := "jobkey"
		if c.intoAsynq {
			into = "asynq"
		}
		t.Run(fmt.Sprintf("into %s, frozen at %q", into, c.at), func(t *testing.T) {
			aq := s.asynqQueue(t, 10*i)
			q := s.queue(t, fmt.Sprintf("q%d-", i))
			id := s.ids(t, q, 1)[0]
			if c.intoAsynq {
				_, err := q.Enqueue(s.ctx, moveType, []byte("p"), &jobkey.EnqueueOpts{ID: id})
				require.NoError(t, err)
			} else {
				_, err := asynq.NewClientFromRedisClient(s.rdb).EnqueueContext(s.ctx, asynq.NewTask(moveType, []byte("p")),
					asynq.TaskID(id), asynq.Queue(aq))
				require.NoError(t, err)
			}
			var frozen atomic.Bool
			freeze := func() error {
				if frozen.CompareAndSwap(false, true) {
					return s.aReplica.Freeze()
				}
				return nil
			}
			if c.at == "" {
				require.NoError(t, freeze())
			}
			hook := func(point, _ string) error {
				if point == c.at {
					return freeze()
				}
				return nil
			}
			run := func(hook func(string, string) error) (MigrateReport, error) {
				if c.intoAsynq {
					return MigrateToAsynq(s.ctx, s.rdb, RollbackOpts{From: q, Type: moveType, ToQueue: aq, Concurrency: 1,
						Wait: 10 * time.Second, crashAt: hook})
				}
				return Migrate(s.ctx, s.rdb, MigrateOpts{FromQueue: aq, Type: moveType, To: q, Concurrency: 1,
					Wait: 10 * time.Second, crashAt: hook})
			}
			rep, err := untilFrozen(t, &frozen, func() (MigrateReport, error) { return run(hook) })
			require.NoError(t, s.aReplica.Thaw())
			require.ErrorIs(t, err, ErrNotReplicated, "the run's report: %+v", rep)
			require.ErrorIs(t, err, jobkey.ErrNotReplicated)
			var re *ReplicationError
			require.ErrorAs(t, err, &re)
			require.Equal(t, id, re.Task)
			require.Equal(t, c.write, re.Write)
			require.Equal(t, aq, re.Queue)
			require.Equal(t, s.aMaster.Addr, s.masterOf(t, re.Key), "the write was on the asynq queue's master")
			require.Equal(t, 1, re.Want)
			require.Zero(t, re.Acked)
			require.Contains(t, err.Error(), fmt.Sprintf("task %q", id))

			rep, err = untilReplicatedRun(t, func() (MigrateReport, error) { return run(nil) })
			require.NoError(t, err)
			require.Empty(t, rep.Twice)
			ti, aerr := asynq.NewInspectorFromRedisClient(s.rdb).GetTaskInfo(aq, id)
			j, jerr := q.Get(s.ctx, id)
			if c.intoAsynq {
				require.ErrorIs(t, jerr, jobkey.ErrNotFound, "the job left jobkey")
				require.NoError(t, aerr)
				require.Equal(t, asynq.TaskStatePending, ti.State, "the task waits in asynq, due")
			} else {
				require.ErrorIs(t, aerr, asynq.ErrTaskNotFound, "the task left asynq")
				require.NoError(t, jerr)
				require.Equal(t, jobkey.StatePending, j.State)
				require.False(t, j.RunAt.Equal(holdUntil), "the job waits in jobkey, due")
			}
		})
	}
}

// A migration into jobkey across a failover of the asynq queue's master:
// the replica is cut off in the middle of the run (the asynq queue's
// writes from then on live on the master alone), the master is killed
// after the run returns, and the replica is promoted. asynq's server and
// jobkey's workers then run, and the migration is rerun once the old
// master is back as a replica. No task is in both systems, none is lost,
// and each runs once. The run stops at its first write the replica did not
// confirm, the delete of the third task, before the jobkey copy that
// depends on it is made due. Before, the run went on and reported success;
// the failover brought the tasks it had deleted back to asynq while their
// jobkey copies were due, and they ran in both.
func TestMigrateAcrossAFailoverRunsEachTaskOnce(t *testing.T) {
	t.Parallel()
	s := setupSplit(t)
	aq := s.asynqQueue(t, 0)
	q := s.queue(t, "emails")
	ids := s.ids(t, q, 6)
	ac := asynq.NewClientFromRedisClient(s.rdb)
	for _, id := range ids {
		_, err := ac.EnqueueContext(s.ctx, asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id), asynq.Queue(aq))
		require.NoError(t, err)
	}

	var cut atomic.Bool
	rep, err := untilFrozen(t, &cut, func() (MigrateReport, error) {
		return Migrate(s.ctx, s.rdb, MigrateOpts{FromQueue: aq, Type: moveType, To: q, Concurrency: 1, lockTTL: 2 * time.Second,
			crashAt: cutAt(ids[2], &cut, s)})
	})
	t.Logf("the run before the failover: moved %d, err %v", rep.Moved, err)
	require.True(t, cut.Load())
	var re *ReplicationError
	require.ErrorAs(t, err, &re, "the run stops at the write its replica did not confirm")
	require.Equal(t, ids[2], re.Task)
	require.Equal(t, "delete the waiting asynq task", re.Write)
	require.Equal(t, 2, rep.Moved, "the two tasks before it")

	s.aMaster.Crash()
	require.NoError(t, s.aReplica.Thaw())
	_, err = s.cl.WaitPromoted(s.aReplica, 30*time.Second)
	require.NoError(t, err)
	s.rdb.ReloadState(s.ctx)

	// No task waits in both systems (in asynq, or due in jobkey: a held
	// copy is not due); one that waits in neither is a move the state
	// records, for the rerun to finish. Which one it is depends on whether
	// the promoted replica got the unconfirmed write before the master
	// died.
	raw, err := s.rdb.Get(s.ctx, stateKey(aq)).Result()
	st, err := decodeState(aq, raw, err)
	require.NoError(t, err)
	ins := asynq.NewInspectorFromRedisClient(s.rdb)
	var runnable []string
	for _, id := range ids {
		ti, aerr := ins.GetTaskInfo(aq, id)
		if aerr != nil && !errors.Is(aerr, asynq.ErrTaskNotFound) {
			require.NoError(t, aerr)
		}
		j, jerr := q.Get(s.ctx, id)
		if jerr != nil && !errors.Is(jerr, jobkey.ErrNotFound) {
			require.NoError(t, jerr)
		}
		inAsynq := aerr == nil && waiting(ti.State.String())
		inJobkey := jerr == nil && j.State == jobkey.StatePending && !j.RunAt.Equal(holdUntil)
		require.False(t, inAsynq && inJobkey, "after the failover, task %s waits in both systems", id)
		if inAsynq || inJobkey {
			runnable = append(runnable, id)
		} else {
			require.Contains(t, st.Moves, id, "after the failover, task %s waits in neither system, and no move of it is recorded: it is lost", id)
		}
	}

	// Both systems run, as they would through a failover.
	var runs sync.Map
	hit := func(id string) {
		n, _ := runs.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
	}
	srv := asynq.NewServerFromRedisClient(s.rdb, asynq.Config{Concurrency: 2, Queues: map[string]int{aq: 1},
		LogLevel: asynq.FatalLevel, DelayedTaskCheckInterval: 100 * time.Millisecond})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		hit(id)
		return nil
	})))
	defer srv.Shutdown()
	wctx, stop := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
			hit(j.ID)
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 2, PollInterval: 20 * time.Millisecond})
	}()
	defer func() { stop(); <-done }()
	ran := func(ids []string) func() bool {
		return func() bool { return !slices.ContainsFunc(ids, func(id string) bool { return count(&runs, id) == 0 }) }
	}
	require.Eventually(t, ran(runnable), 30*time.Second, 20*time.Millisecond, "every task that waits runs, in one system or the other")

	// The old master comes back, as a replica of the promoted one: until a
	// replica confirms them, the rerun's writes stop it as the first run's
	// did.
	s.aMaster.Relaunch(t)
	rep, err = untilReplicatedRun(t, func() (MigrateReport, error) {
		return Migrate(s.ctx, s.rdb, MigrateOpts{FromQueue: aq, Type: moveType, To: q, Wait: 10 * time.Second})
	})
	require.NoError(t, err)
	t.Logf("the rerun after the failover: moved %d, finished %d, undone %d, left %d, twice %d",
		rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Left), len(rep.Twice))
	require.Empty(t, rep.Twice)
	require.Eventually(t, ran(ids), 30*time.Second, 20*time.Millisecond, "every task runs once the rerun finished its move")
	time.Sleep(time.Second) // a second run, if any, has time to show
	for _, id := range ids {
		require.Equal(t, 1, count(&runs, id), "task %s ran %d times", id, count(&runs, id))
	}
}

// cutAt returns a crash hook that, once the move of task id has read the
// task before its delete, stops the asynq queue's replica and drops the
// master's link to it: what the master writes from then on is on the
// master alone.
func cutAt(id string, cut *atomic.Bool, s *splitCluster) func(point, id string) error {
	return func(point, at string) error {
		if point != atAfterReread || at != id || !cut.CompareAndSwap(false, true) {
			return nil
		}
		if err := s.aReplica.Freeze(); err != nil {
			return err
		}
		return s.aMaster.DropReplicas(s.ctx)
	}
}

// The WAIT of each of a run's own writes is in the write's own round trip:
// MULTI, the writes, EXEC, WAIT, in one pipeline on the connection that
// ran the EXEC. MinReplicas given to the run applies even where the jobkey
// queue's own is 0.
func TestMigrationWaitIsInTheWritesRoundTrip(t *testing.T) {
	t.Parallel()
	set := redistest.StartReplicated(t, 1)
	sent := &pipeLog{}
	rdb := redistest.ClientFor(t, set.Master.URL(), nil)
	rdb.AddHook(sent)
	ctx := context.Background()
	q, err := jobkey.NewQueue(rdb, "emails", &jobkey.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	ac := asynq.NewClientFromRedisClient(rdb)
	for _, id := range []string{"a", "b", "c"} {
		_, err := ac.EnqueueContext(ctx, asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id))
		require.NoError(t, err)
	}
	// A long ReplicaTimeout: the replica runs, and only a loaded machine
	// could make it slow.
	rep, err := Migrate(ctx, rdb, MigrateOpts{Type: moveType, To: q, MinReplicas: 1, ReplicaTimeout: 30 * time.Second, PauseQueue: true})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Moved)
	rep, err = MigrateToAsynq(ctx, rdb, RollbackOpts{From: q, Type: moveType, MinReplicas: 1, ReplicaTimeout: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Moved)

	own := 0
	for _, p := range sent.all() {
		if !slices.ContainsFunc(p, func(args []string) bool {
			return slices.ContainsFunc(args, func(a string) bool { return a == stateKey("default") || a == claimKey(q) || a == "asynq:queues" })
		}) || !slices.ContainsFunc(p, func(args []string) bool { return args[0] == "exec" }) {
			continue // not a write of the run's own
		}
		own++
		names := make([]string, len(p))
		for i, args := range p {
			names[i] = args[0]
		}
		require.Equal(t, "multi", names[0], "pipeline %v", names)
		require.Equal(t, []string{"exec", "wait"}, names[len(names)-2:], "pipeline %v: WAIT right after EXEC", names)
		require.Equal(t, "1", p[len(p)-1][1], "WAIT for one replica")
	}
	// Into jobkey: the claim, the pause, and per task its record, delete
	// and end; the resume and the claim's release. Into asynq: the claim,
	// per task its record, asynq:queues, its copy, its release and end; the
	// claim's release.
	require.Equal(t, 2+3*3+2+1+3*5+1, own)
}

// pipeLog records the arguments of every pipeline a client sends.
type pipeLog struct {
	mu    sync.Mutex
	pipes [][][]string
}

func (l *pipeLog) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (l *pipeLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (l *pipeLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p := make([][]string, len(cmds))
		for i, c := range cmds {
			for _, a := range c.Args() {
				p[i] = append(p[i], fmt.Sprint(a))
			}
		}
		l.mu.Lock()
		l.pipes = append(l.pipes, p)
		l.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (l *pipeLog) all() [][][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pipes)
}

// MinReplicas and ReplicaTimeout default to the jobkey queue's; a
// negative MinReplicas waits for none, and values out of range are
// refused.
func TestMigrationDurabilityDefaultsToTheQueues(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 4 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	q, err := jobkey.NewQueue(rdb, "q", &jobkey.Config{MinReplicas: 2, ReplicaTimeout: 700 * time.Millisecond})
	require.NoError(t, err)
	for _, c := range []struct {
		replicas int
		timeout  time.Duration
		want     durability
		err      string
	}{
		{0, 0, durability{replicas: 2, timeout: 700 * time.Millisecond, readTimeout: 4 * time.Second}, ""},
		{1, time.Second, durability{replicas: 1, timeout: time.Second, readTimeout: 4 * time.Second}, ""},
		{-1, 0, durability{replicas: 0, timeout: 700 * time.Millisecond, readTimeout: 4 * time.Second}, ""},
		{65, 0, durability{}, "MinReplicas"},
		{1, -time.Second, durability{}, "ReplicaTimeout"},
		{1, 2 * time.Minute, durability{}, "ReplicaTimeout"},
	} {
		got, err := durabilityOf(rdb, q, c.replicas, c.timeout)
		if c.err != "" {
			require.ErrorContains(t, err, c.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.want, got)
	}
	require.Equal(t, 700*time.Millisecond, durability{replicas: 1, timeout: 700 * time.Millisecond, readTimeout: 4 * time.Second}.firstWait())
	require.Equal(t, 2*time.Second, durability{replicas: 1, timeout: 5 * time.Second, readTimeout: 4 * time.Second}.firstWait(),
		"half the ReadTimeout, so that the pipeline's read does not time out")
}
