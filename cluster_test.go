package jobkey

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/cluster"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// drain runs Work until the queue holds no pending or active job.
func drainWithWork(t *testing.T, q *Queue, onRecorded func(*Job, error)) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			return []byte(j.LeaseOwner), nil
		}), &WorkOpts{Concurrency: 8, PollInterval: 20 * time.Millisecond, Logger: quiet, OnRecorded: onRecorded})
	}()
	require.Eventually(t, func() bool {
		st, err := q.Stats(context.Background())
		return err == nil && st.Pending+st.Active == 0
	}, 60*time.Second, 20*time.Millisecond)
	stop()
	require.NoError(t, <-done)
}

func TestClusterLifecycle(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second})
	require.Equal(t, defaultClusterShards, q.cfg.Shards, "the cluster default")

	batch := make([]JobSpec, 300)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: fmt.Sprintf("b%d", i)}}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	for i := range 20 {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("s%d", i)})
		require.NoError(t, err)
	}
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 320, st.Pending)

	// Fencing across the cluster: A's lease expires, B claims, A is fenced off.
	a, err := q.Claim(ctx, "A")
	require.NoError(t, err)
	many, err := q.ClaimMany(ctx, "M", 10)
	require.NoError(t, err)
	require.NotEmpty(t, many)
	_, err = q.CompleteMany(ctx, many, nil)
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)
	var b *Job
	for b == nil || b.ID != a.ID { // claim until the expired job comes round
		b, err = q.Claim(ctx, "B")
		require.NoError(t, err)
		if b.ID != a.ID {
			_, err = q.Complete(ctx, b, nil)
			require.NoError(t, err)
		}
	}
	_, err = q.Complete(ctx, a, []byte("A"))
	require.ErrorIs(t, err, ErrLeaseLost)
	_, err = q.Complete(ctx, b, []byte("B"))
	require.NoError(t, err)

	var twice atomic.Int64
	seen := sync.Map{}
	drainWithWork(t, q, func(j *Job, err error) {
		if err == nil && j.State == StateSucceeded {
			if _, dup := seen.LoadOrStore(j.ID, true); dup {
				twice.Add(1)
			}
		}
	})
	require.Zero(t, twice.Load())
	st, err = q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 320}, st)
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	require.Equal(t, 320, rep.Jobs, "Verify reads the values on every master")

	// One unlisted job per shard, so every master holds some: Verify finds
	// them all and fixes them.
	unlisted := map[int]string{}
	for i := 0; len(unlisted) < q.cfg.Shards; i++ {
		id := fmt.Sprintf("b%d", i%300)
		if _, s := q.ks.jobKeyOf(id); unlisted[s] == "" {
			unlisted[s] = id
			require.NoError(t, rdb.ZRem(ctx, q.Keys(id).Succeeded, id).Err())
		}
	}
	rep, err = q.Verify(ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, q.cfg.Shards)
	rep, err = q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// nodeOf returns the index of the master that owns key.
func nodeOf(t *testing.T, rdb *redis.ClusterClient, cl *redistest.Cluster, key string) int {
	t.Helper()
	node, err := rdb.MasterForKey(context.Background(), key)
	require.NoError(t, err)
	for i, a := range cl.Addrs() {
		if node.Options().Addr == a {
			return i
		}
	}
	t.Fatalf("no master for %s", key)
	return -1
}

// callsOn sums the calls of every command INFO commandstats counts on a node.
func callsOn(t *testing.T, addr string) int64 {
	t.Helper()
	c := redistest.ClientFor(t, "redis://"+addr, nil)
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(line, "calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			total += n
		}
	}
	return total
}

// With 3 masters and the default shards, each master holds between 25% and
// 42% of a queue's job keys and serves a share of its commands in the same
// band.
func TestClusterSpread(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "spread", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	before := make([]int64, 3)
	for i, a := range cl.Addrs() {
		before[i] = callsOn(t, a)
	}
	const n = 3000
	batch := make([]JobSpec, 0, 100)
	for i := range n {
		batch = append(batch, JobSpec{Type: "t"})
		if len(batch) == cap(batch) || i == n-1 {
			_, err := q.EnqueueMany(ctx, batch)
			require.NoError(t, err)
			batch = batch[:0]
		}
	}
	drainWithWork(t, q, nil)

	keys := make([]int, 3)
	for s := range q.ks.shards {
		cnt, err := rdb.ZCard(ctx, q.ks.index(s, idxSucceeded)).Result()
		require.NoError(t, err)
		keys[nodeOf(t, rdb, cl, q.ks.index(s, idxSucceeded))] += int(cnt)
	}
	var calls [3]int64
	var totalCalls int64
	for i, a := range cl.Addrs() {
		calls[i] = callsOn(t, a) - before[i]
		totalCalls += calls[i]
	}
	for i := range 3 {
		share, cmdShare := float64(keys[i])/n, float64(calls[i])/float64(totalCalls)
		t.Logf("master %d: %.1f%% of job keys, %.1f%% of commands", i, 100*share, 100*cmdShare)
		require.GreaterOrEqual(t, share, 0.25)
		require.LessOrEqual(t, share, 0.42)
		require.GreaterOrEqual(t, cmdShare, 0.25)
		require.LessOrEqual(t, cmdShare, 0.42)
	}
}

// Slots move between masters while producers and workers run: MOVED and ASK
// are retried on the new owner, and nothing is lost or finished twice.
func TestClusterReshardUnderLoad(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "reshard", &Config{Prefix: redistest.Prefix(t), Lease: 2 * time.Second})
	require.NoError(t, err)

	var acked sync.Map
	var ackedN atomic.Int64
	var twice atomic.Int64
	var succeeded sync.Map
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			for n := 0; loadCtx.Err() == nil; n++ {
				id := fmt.Sprintf("p%d-%d", p, n)
				for loadCtx.Err() == nil {
					_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id})
					if err == nil || errors.Is(err, ErrJobExists) {
						acked.Store(id, true)
						ackedN.Add(1)
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	workCtx, stopWork := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(workCtx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
			&WorkOpts{Concurrency: 8, PollInterval: 20 * time.Millisecond, Logger: quiet,
				OnRecorded: func(j *Job, err error) {
					if err == nil && j.State == StateSucceeded {
						if _, dup := succeeded.LoadOrStore(j.ID, true); dup {
							twice.Add(1)
						}
					}
				}})
	}()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, cl.Reshard(cl.Nodes[0], cl.Nodes[1], 2000))
	require.NoError(t, cl.Reshard(cl.Nodes[1], cl.Nodes[2], 3000))
	time.Sleep(300 * time.Millisecond)
	stopLoad()
	wg.Wait()
	require.Eventually(t, func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.Pending+st.Active == 0
	}, 60*time.Second, 20*time.Millisecond)
	stopWork()
	require.NoError(t, <-werr)

	lost := 0
	acked.Range(func(k, _ any) bool {
		j, err := q.Get(ctx, k.(string))
		if err != nil || j.State != StateSucceeded {
			lost++
		}
		return true
	})
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	t.Logf("reshard under load: %d jobs enqueued, %d lost, %d finished twice, %d hint mismatches; CAS conflicts and redirections retried: %d",
		ackedN.Load(), lost, twice.Load(), len(rep.Findings), q.Metrics().Conflicts)
	require.Positive(t, ackedN.Load())
	require.Zero(t, lost)
	require.Zero(t, twice.Load())
	require.Empty(t, rep.Findings)
}

// Group-commit enqueues on a cluster are answered by the transaction that
// carried each job: a shard whose transaction is refused does not turn
// jobs just written on other shards into ErrJobExists.
func TestClusterGroupEnqueueAnswersPerShard(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Shards: 8})
	const broken = 3
	require.NoError(t, rdb.Set(ctx, q.ks.index(broken, idxReady), "not a zset", 0).Err())

	var ok, wrongType, exists, other atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 20 {
				j, err := q.Enqueue(ctx, "t", nil, nil)
				switch {
				case err == nil:
					ok.Add(1)
					require.NotEqual(t, broken, q.ks.shardOf(j.ID))
					_, err := q.Get(ctx, j.ID)
					require.NoError(t, err)
				case errors.Is(err, ErrWrongType):
					wrongType.Add(1)
				case errors.Is(err, ErrJobExists):
					exists.Add(1)
				default:
					other.Add(1)
					t.Errorf("enqueue: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("written %d, refused on the broken shard %d, ErrJobExists %d", ok.Load(), wrongType.Load(), exists.Load())
	require.Zero(t, exists.Load(), "no caller is told its own new job already exists")
	require.Zero(t, other.Load())
	require.Positive(t, wrongType.Load())
}

// One dead master of three (cluster-require-full-coverage no) does not stop
// the others: claims find the jobs of the live masters, Work drains them,
// Stats and Verify answer for the shards they can read and name the
// others.
func TestClusterDeadMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout, o.MaxRetries = 300*time.Millisecond, 1 })
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second})
	batch := make([]JobSpec, 600)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: fmt.Sprintf("j%d", i)}}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	dead := cl.Nodes[2]
	deadShards := map[int]bool{}
	for s := range q.ks.shards {
		if nodeOf(t, rdb, cl, q.ks.index(s, idxReady)) == 2 {
			deadShards[s] = true
		}
	}
	require.NotEmpty(t, deadShards)
	onLive := 0
	for i := range batch {
		if !deadShards[q.ks.shardOf(fmt.Sprintf("j%d", i))] {
			onLive++
		}
	}
	dead.Stop()

	st, err := q.Stats(ctx)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Len(t, se.Shards, len(deadShards))
	require.EqualValues(t, onLive, st.Pending, "the live shards are counted")

	byHand := map[string]bool{} // completed before Work starts
	for range 50 {
		j, err := q.Claim(ctx, "w")
		require.NoError(t, err, "jobs are due on the live masters")
		require.False(t, deadShards[q.ks.shardOf(j.ID)])
		byHand[j.ID] = true
		_, err = q.Complete(ctx, j, nil)
		require.NoError(t, err)
	}
	many, err := q.ClaimMany(ctx, "w", 20)
	require.NoError(t, err)
	require.NotEmpty(t, many)
	_, err = q.CompleteMany(ctx, many, nil)
	require.NoError(t, err)

	for _, j := range many {
		byHand[j.ID] = true
	}
	var mu sync.Mutex
	runs := map[string]int{}
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[j.ID]++
			return nil, nil
		}), &WorkOpts{Concurrency: 8, PollInterval: 20 * time.Millisecond, Logger: quiet})
	}()
	require.Eventually(t, func() bool {
		st, _ := q.Stats(ctx)
		return st.Succeeded == int64(onLive)
	}, 60*time.Second, 50*time.Millisecond, "Work drains the live masters")
	stop()
	require.NoError(t, <-werr)
	// Every job left on the live masters ran, and one ran again only under
	// a claim of its own: a success not recorded before its 1 s lease
	// ended (a stalled transaction beside the dead master) is run again,
	// as at-least-once allows, and each run then counts an attempt.
	ranByWork := 0
	for id, n := range runs {
		require.False(t, byHand[id], "%s was completed before Work started", id)
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		require.GreaterOrEqual(t, j.Attempt, n, "%s ran %d times under %d claims", id, n, j.Attempt)
		ranByWork++
	}
	require.Equal(t, onLive-50-len(many), ranByWork, "every job left on the live masters ran")

	rep, err := q.Verify(ctx, nil)
	require.ErrorAs(t, err, &se)
	require.Len(t, se.Shards, len(deadShards))
	require.Empty(t, rep.Findings)
}

// On a cluster, Verify finds a shard's job keys after the shard's slot has
// moved, though SCAN is not redirected and the ClusterClient's cached slot
// map may still name the old master. A SCAN of the old master finds no job
// keys there, and would have every index entry of the shard reported as a
// "stray-entry ... there is no job value" although every value is in place
// (reads by key follow MOVED). The slot-map reload that MOVED triggers is
// asynchronous, so whether Verify sees the new owner is a race (it showed as
// a flake of TestLeastPrivilegeCluster); here the reload is made to take
// 300ms so that it loses every time.
func TestClusterVerifyAfterSlotMove(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	plain := redistest.ClientFor(t, "redis://"+cl.Addrs()[0], nil)
	var slow atomic.Bool
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		// The slot map as CLUSTER SLOTS gives it, read with some latency
		// (a loaded node, a long way off): a reload lands a moment later.
		o.ClusterSlots = func(ctx context.Context) ([]redis.ClusterSlot, error) {
			if slow.Load() {
				time.Sleep(300 * time.Millisecond)
			}
			//lint:ignore SA1019 ClusterOptions.ClusterSlots takes CLUSTER SLOTS' shape
			return plain.ClusterSlots(ctx).Result()
		}
	})
	admin, err := NewQueue(rdb, "q", &Config{})
	require.NoError(t, err)
	var ids []string
	for range 40 {
		j, err := admin.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	rep, err := admin.Verify(ctx, &VerifyOpts{Keys: true}) // the admin's slot map is loaded and current
	require.NoError(t, err)
	require.Empty(t, rep.Findings)

	// Someone else moves the slot of one job's shard to another master.
	keys := admin.Keys(ids[0])
	_, finish := halfMigrate(t, cl, keys.Job, keys.Ready)
	finish()
	slow.Store(true)

	rep, err = admin.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	got, err := admin.Get(ctx, ids[0])
	require.NoError(t, err, "the value is in place, and reads by key find it")
	require.Equal(t, StatePending, got.State)
	t.Logf("findings after the move: %d, e.g. %v", len(rep.Findings), rep.Findings[:min(2, len(rep.Findings))])
	require.Empty(t, rep.Findings, "Verify reported intact jobs as stray entries")
}

// On a cluster, a Claim whose caller's deadline passes while the due read is
// in flight (a slow link, a short per-call timeout) marks no shard down: the
// caller's deadline, context.DeadlineExceeded, says nothing about the node.
// A shard marked down fails every Enqueue, Complete, Fail... of its jobs at
// once for the next 2s with "the node of shard N could not be reached",
// which on a cluster whose every node is up and answering would be false.
func TestClusterClaimTimeoutMarksNoShardDown(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	var slow atomic.Bool
	rdb := cl.Client(t, nil)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slow.Load() && has(cmds, "zrangebyscore", ":ready") {
			<-ctx.Done() // the link is slow: the caller's deadline passes first
		}
		return nil
	}))
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	slow.Store(true)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = q.Claim(short, "w")
	cancel()
	slow.Store(false)
	require.Error(t, err, "the caller gave up")

	failed := 0
	var first error
	for i := range 32 {
		if _, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("after-%d", i)}); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	require.Zero(t, failed, "every node is up, yet %d of 32 enqueues failed, e.g.: %v", failed, first)
}

// The same without any hook: a Claim called with a context that has
// already ended (DisableGroupCommit, so it is not refused up front) marks
// every shard of the healthy cluster down.
func TestClusterCanceledClaimMarksNoShardDown(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog(), DisableGroupCommit: true})
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = q.Claim(gone, "w")
	require.ErrorIs(t, err, context.Canceled)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err, "every node is up")
}

// What the false down mark costs a running job: the keeper's renewals of a
// job on a shard marked down fail at once (extends go through eachTxn
// too), so with a short lease the worker fences itself off and stops a
// healthy run with ErrLeaseExpired, on a cluster whose every node is up.
func TestClusterRenewalsNeverFailFast(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3) // its own: it measures how soon things happen
	var slow atomic.Bool
	rdb := cl.Client(t, nil)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slow.Load() && has(cmds, "zrangebyscore", ":ready") {
			<-ctx.Done()
		}
		return nil
	}))
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second, Logger: quietLog()})
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "long"})
	require.NoError(t, err)

	started := make(chan struct{})
	causes := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
			close(started)
			select {
			case <-time.After(3 * time.Second):
				causes <- nil
			case <-hctx.Done():
				causes <- context.Cause(hctx)
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1, Logger: quietLog(), TrimInterval: -1})
	}()
	<-started
	// Elsewhere in the process, a claim with a short deadline on a slow link.
	slow.Store(true)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _ = q.Claim(short, "other")
	cancel()
	slow.Store(false)

	require.NoError(t, <-causes, "a healthy run on a healthy cluster was stopped")
	stop()
	require.NoError(t, <-werr)
}

// The operator's calls over a 3-master cluster: a listing merges every
// shard, each job once; Pause holds on every shard; the bulk actions and
// Queues reach every master.
func TestClusterOperatorSurface(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	q := queueOn(t, rdb, prefix, Config{Lease: time.Second})
	other, err := NewQueue(rdb, "other", &Config{Prefix: prefix, Shards: 2})
	require.NoError(t, err)
	_, err = other.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	batch := make([]JobSpec, 300)
	for i := range batch {
		batch[i] = JobSpec{Type: []string{"a", "b"}[i%2], Opts: &EnqueueOpts{ID: fmt.Sprintf("j%03d", i), MaxAttempts: 1}}
	}
	_, err = q.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	seen := map[string]int{}
	o := ListOpts{State: StatePending, Limit: 7}
	for {
		p, err := q.List(ctx, o)
		require.NoError(t, err)
		require.Empty(t, p.Unreadable)
		for _, j := range p.Jobs {
			seen[j.ID]++
		}
		if p.Next == "" {
			break
		}
		o.Cursor = p.Next
	}
	require.Len(t, seen, 300)
	for id, n := range seen {
		require.Equal(t, 1, n, "job %s", id)
	}

	require.NoError(t, q.Pause(ctx))
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.Equal(t, q.cfg.Shards, st.PausedShards, "every shard")
	_, err = q.ClaimMany(ctx, "w", 10)
	require.ErrorIs(t, err, ErrNoJob)
	_, err = q.Claim(ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	require.NoError(t, q.Resume(ctx))

	// Fail the type-a jobs for good, then act on them in bulk.
	failed := 0
	for failed < 150 {
		c, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		if c.Type == "a" {
			_, err = q.Fail(ctx, c, fmt.Errorf("boom"))
			failed++
		} else {
			_, err = q.Release(ctx, c)
		}
		require.NoError(t, err)
	}
	res, err := q.CancelPending(ctx, "b")
	require.NoError(t, err)
	require.Equal(t, 150, res.Done)
	res, err = q.RetryFailed(ctx, "")
	require.NoError(t, err)
	require.Equal(t, 150, res.Done)
	res, err = q.DeleteFinished(ctx, StateCanceled, "")
	require.NoError(t, err)
	require.Equal(t, 150, res.Done)
	require.NoError(t, q.Delete(ctx, "j000"))
	st, err = q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Pending: 149, Due: 149, DueByPriority: [MaxPriority + 1]int64{149}}, st)

	names, err := Queues(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Equal(t, []string{"other", "q"}, names)
}

// Concurrency keys on a cluster queue of the default 16 shards: each keyed
// job lives in its key's shard, beside its key's value, so a claim reads
// and changes both in one slot. Three keys of limit 2, run by 2 Work
// instances of 6 slots each: no key ever runs more than 2 handlers at once
// (and each reaches 2), every job runs and succeeds once and Get finds it,
// every key ends with no active lease, and Verify finds nothing. A
// caller's ID outside its key's shard is refused until IDFor places it.
func TestClusterConcurrencyKeys(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	cfg := &Config{Prefix: prefix, Lease: 2 * time.Second, Logger: quietLog()}
	q, err := NewQueue(cl.Client(t, nil), "ck", cfg)
	require.NoError(t, err)
	require.Equal(t, defaultClusterShards, q.cfg.Shards)
	other, err := NewQueue(cl.Client(t, nil), "ck", cfg) // a second process
	require.NoError(t, err)

	keys := []string{"tenant-a", "tenant-b", "tenant-c"}
	nodes := map[int]bool{}
	for _, k := range keys {
		require.NoError(t, q.SetConcurrencyLimit(ctx, k, 2))
		nodes[nodeOf(t, q.rdb.(*redis.ClusterClient), cl, q.ks.slotKey(q.ks.shardOf(k), k))] = true
		t.Logf("key %s: shard %d", k, q.ks.shardOf(k))
	}

	// A caller's ID is placed in its key's shard by IDFor, and refused
	// anywhere else.
	var ids []string
	for i, k := range keys {
		base := fmt.Sprintf("order-%d", i)
		for q.ks.shardOf(base) == q.ks.shardOf(k) {
			base += "x"
		}
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: base, ConcurrencyKey: k})
		require.ErrorIs(t, err, ErrInvalid, "ID %s is not in the shard of key %s", base, k)
		_, err = q.Get(ctx, base)
		require.ErrorIs(t, err, ErrNotFound, "nothing was written")
		id, err := q.IDFor(k, base)
		require.NoError(t, err)
		require.NotEqual(t, base, id)
		require.Equal(t, q.ks.shardOf(k), q.ks.shardOf(id))
		j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: k})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	const perKey = 40
	specs := make([]JobSpec, 0, perKey*len(keys))
	for i := range perKey * len(keys) {
		specs = append(specs, JobSpec{Type: "t", Opts: &EnqueueOpts{ConcurrencyKey: keys[i%len(keys)], Priority: i % 2}})
	}
	jobs, err := q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	for _, j := range jobs {
		require.Equal(t, q.ks.shardOf(j.ConcurrencyKey), q.ks.shardOf(j.ID), "a generated ID is drawn in its key's shard")
		ids = append(ids, j.ID)
	}

	var mu sync.Mutex
	running, peak := map[string]int{}, map[string]int{}
	log := newLeaseLog()
	h := HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		defer log.begin(j)()
		mu.Lock()
		running[j.ConcurrencyKey]++
		peak[j.ConcurrencyKey] = max(peak[j.ConcurrencyKey], running[j.ConcurrencyKey])
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		running[j.ConcurrencyKey]--
		mu.Unlock()
		return nil, nil
	})
	wctx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	var wg sync.WaitGroup
	werrs := make(chan error, 2)
	for w, wq := range []*Queue{q, other} {
		wg.Go(func() {
			werrs <- wq.Work(wctx, h, &WorkOpts{Concurrency: 6, Name: fmt.Sprintf("p%d", w), PollInterval: 20 * time.Millisecond,
				Logger: quietLog(), OnRecorded: log.onRecorded})
		})
	}
	waitSucceeded(t, wctx, q, len(ids))
	stop()
	wg.Wait()
	close(werrs)
	for err := range werrs {
		require.NoError(t, err)
	}

	t.Logf("%d jobs over %d masters; peak handlers per key: %v", len(ids), len(nodes), peak)
	for _, k := range keys {
		require.Equal(t, 2, peak[k], "key %s: at most its limit of handlers at once, and the limit was used", k)
		info, err := q.Concurrency(ctx, k)
		require.NoError(t, err)
		require.Equal(t, ConcurrencyInfo{Key: k, Limit: 2, Own: true}, info)
	}
	// A job may run again when its run's outcome could not be recorded
	// before its lease ran out (see leaseLog): never two runs at once, and
	// each job finished once.
	if n := log.check(t, ctx, q, ids); n > 0 {
		t.Logf("%d reruns after a lost outcome", n)
	}
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(ids), st.Succeeded)
	require.Zero(t, st.Pending+st.Active)
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// On a Redis Cluster of 3 masters and 16 shards, with 600 jobs of priority
// 0 in one shard and 2 slots finishing them, a job due on a shard of
// another master is claimed within the bound: a priority-9 job that comes
// due later (no hint then), a priority-0 job due at once, and a priority-0
// job that comes due later. A fused slot used to take candidates only of
// the shard of the job it finished, and to read ahead only that shard, so
// it claimed elsewhere only once that shard had nothing due.
func TestClusterWorkClaimsDueJobsOfEveryShardWithinBound(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3) // its own: it measures how soon things happen
	ctx := context.Background()
	cfg := &Config{Prefix: redistest.Prefix(t), Logger: quietLog()}
	q, err := NewQueue(cl.Client(t, nil), "q", cfg)
	require.NoError(t, err)
	require.Equal(t, defaultClusterShards, q.cfg.Shards)
	producer, err := NewQueue(cl.Client(t, nil), "q", cfg) // another process
	require.NoError(t, err)
	master := func(shard int) int {
		return nodeOf(t, q.rdb.(*redis.ClusterClient), cl, q.ks.jobKey(shard, "x"))
	}
	busy := 0
	others := []int{} // shards on the other masters
	for s := 1; s < q.ks.shards; s++ {
		if master(s) != master(busy) {
			others = append(others, s)
		}
	}
	require.GreaterOrEqual(t, len(others), 3)
	specs := make([]JobSpec, 600)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: idOnShard(q, fmt.Sprintf("b%d-", i), busy)}}
	}
	_, err = q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	jobs := []dueJob{
		{id: idOnShard(q, "hi-", others[0]), prio: MaxPriority, delay: 300 * time.Millisecond},
		{id: idOnShard(q, "lo-", others[len(others)-1]), prio: 0},
		{id: idOnShard(q, "late-", others[len(others)/2]), prio: 0, delay: 300 * time.Millisecond},
	}
	for id, d := range dueLatencies(t, q, producer, jobs) {
		require.LessOrEqual(t, d, claimBound+250*time.Millisecond, "job %s started %v after coming due", id, d)
	}
}

// A master that stays dead, with 8 producers enqueueing onto every shard
// for 5 s, costs a bounded number of CLUSTER SLOTS, not one per call; and
// its shards stay down all along, while the others take jobs.
func TestDeadNodeReloadsTheSlotMapBoundedAndKeepsItsShardsDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	ctx := context.Background()
	owner, err := rdb.MasterForKey(ctx, q.ks.index(0, idxReady))
	require.NoError(t, err)
	dead := owner.Options().Addr
	var deadShards []int
	for s := range q.cfg.Shards {
		m, err := rdb.MasterForKey(ctx, q.ks.index(s, idxReady))
		require.NoError(t, err)
		if m.Options().Addr == dead {
			deadShards = append(deadShards, s)
		}
	}
	var live []*redis.Client
	for _, m := range cl.Masters() {
		if m.Addr == dead {
			m.Crash()
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.ConfigResetStat(ctx).Err())
		live = append(live, c)
	}

	const run = 5 * time.Second
	stop := time.Now().Add(run)
	var ok, failed, upWhileDead atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := q.Enqueue(cctx, "t", nil, nil)
				cancel()
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				for _, s := range deadShards {
					if q.down.Moved(s) {
						upWhileDead.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()

	slots := 0
	for _, c := range live {
		info, err := c.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if rest, found := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_cluster|slots:calls="); found {
				n, _ := strconv.Atoi(rest[:strings.Index(rest, ",")])
				slots += n
			}
		}
	}
	t.Logf("dead %s shards %v: enqueued %d, failed %d, CLUSTER SLOTS %d in %s", dead, deadShards, ok.Load(), failed.Load(), slots, run)
	require.Positive(t, ok.Load(), "the live shards take jobs")
	require.Positive(t, failed.Load())
	require.LessOrEqual(t, slots, 2*int(run/cluster.ReloadEvery)+4, "reloads are bounded")
	require.Zero(t, upWhileDead.Load(), "a shard of the dead node is never up")
}

// On a cluster whose nodes announce host names, a call that failed on the
// dead owner's address (which the dialer names by IP) marks its shard down.
func TestShardDownWhenTheSlotMapNamesTheNodeByHostName(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-announce-hostname", "localhost", "--cluster-preferred-endpoint-type", "hostname")
	rdb := cl.Client(t, nil)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	ctx := context.Background()
	key := q.ks.index(0, idxReady)
	owner, err := rdb.MasterForKey(ctx, key)
	require.NoError(t, err)
	require.Contains(t, owner.Options().Addr, "localhost:")
	_, port, err := net.SplitHostPort(owner.Options().Addr)
	require.NoError(t, err)
	for _, m := range cl.Masters() {
		if strings.HasSuffix(m.Addr, ":"+port) {
			m.Crash()
		}
	}
	err = rdb.Get(ctx, key).Err()
	require.True(t, q.unreachable(ctx, err), "%v", err)
	q.down.Add(0, err)
	require.True(t, q.down.Has(0), "the slot still names the node that could not be reached: %v", err)
}

// With a master dead, ConcurrencyKeys lists the keys of the live masters'
// shards and names the dead one's shards in a *ShardsError: it does not
// fail whole.
func TestClusterConcurrencyKeysOfTheLiveMastersWhenOneIsDead(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout, o.MaxRetries = 300*time.Millisecond, 1 })
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second})
	deadShards := map[int]bool{}
	for s := range q.ks.shards {
		if nodeOf(t, rdb, cl, q.ks.index(s, idxReady)) == 2 {
			deadShards[s] = true
		}
	}
	require.NotEmpty(t, deadShards)
	var live []string
	for i := range 40 {
		k := fmt.Sprintf("tenant-%d", i)
		require.NoError(t, q.SetConcurrencyLimit(ctx, k, 2))
		if !deadShards[q.ks.shardOf(k)] {
			live = append(live, k)
		}
	}
	require.NotEmpty(t, live)
	slices.Sort(live)
	cl.Nodes[2].Stop()

	keys, more, err := q.ConcurrencyKeys(ctx)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.False(t, more)
	got := make([]int, 0, len(se.Shards))
	for s := range deadShards {
		got = append(got, s)
	}
	slices.Sort(got)
	require.Equal(t, got, se.Shards, "the dead master's shards, named")
	var names []string
	for _, k := range keys {
		require.NoError(t, k.Err)
		require.Equal(t, 2, k.Limit)
		names = append(names, k.Key)
	}
	require.Equal(t, live, names, "every key of the live masters")
}

// With a master dead, Throughput and CountByType count the live masters'
// shards and name the dead one's: neither fails whole.
func TestClusterThroughputAndCountByTypeOfTheLiveMastersWhenOneIsDead(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout, o.MaxRetries = 300*time.Millisecond, 1 })
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second})
	var dead []int
	for s := range q.ks.shards {
		if nodeOf(t, rdb, cl, q.ks.index(s, idxReady)) == 2 {
			dead = append(dead, s)
		}
	}
	require.NotEmpty(t, dead)
	onLive := 0
	for i := range 200 {
		j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("j%d", i)})
		require.NoError(t, err)
		c, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		_, err = q.Complete(ctx, c, nil)
		require.NoError(t, err)
		if !slices.Contains(dead, q.ks.shardOf(j.ID)) {
			onLive++
		}
	}
	cl.Nodes[2].Stop()

	now, err := q.clock.Now(ctx, q.rdb)
	require.NoError(t, err)
	th, err := q.Throughput(ctx, now.Add(-time.Hour), now.Add(time.Minute), time.Minute)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, dead, se.Shards)
	var ok int64
	for _, b := range th.Buckets {
		ok += b.Succeeded
	}
	require.EqualValues(t, onLive, ok)

	tc, err := q.CountByType(ctx, 0)
	require.ErrorAs(t, err, &se)
	require.Equal(t, dead, se.Shards)
	require.Len(t, tc.Types, 1)
	require.EqualValues(t, onLive, tc.Types[0].Succeeded)
}
