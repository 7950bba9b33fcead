package jobkey

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// This file runs producers and Work through the loss of a master: the
// replica is stalled just before the master is killed (SIGKILL), so that
// the writes of the last moment are not on it, and Sentinel or the cluster
// promotes it. The figures are those of the operations guide.

// failoverCase is one failover to run under load.
type failoverCase struct {
	rdb     redis.UniversalClient
	cfg     Config // Prefix and Lease are set by runFailover
	payload int    // bytes per job
	// fail stalls the replica, kills the master and returns when the
	// replica is promoted: the times of the kill and of the promotion.
	fail func(t *testing.T) (killed, promoted time.Time)
	// affected says which IDs live on the master that is killed; prepare,
	// when set, returns it once the Queue exists.
	affected func(id string) bool
	prepare  func(t *testing.T, q *Queue) func(id string) bool
}

// failoverFigures are what a failover did to the queue. Times are after
// the promotion, except Promoted (after the kill).
type failoverFigures struct {
	Enqueued, EnqueuesLost         int
	Completed, CompletionsLost     int // acknowledged; lost: the job ran again, or is gone
	Stuck, FinishedTwice, Overlaps int
	Promoted                       time.Duration
	ProducersBack, WorkersBack     time.Duration
}

func (f failoverFigures) String() string {
	return fmt.Sprintf("promoted %v after the kill; producers back %v and workers back %v after it; "+
		"%d enqueues acknowledged, %d lost; %d completions acknowledged, %d lost (ran again or gone); "+
		"%d stuck, %d finished twice, %d overlapping runs",
		f.Promoted.Round(time.Millisecond), f.ProducersBack.Round(time.Millisecond), f.WorkersBack.Round(time.Millisecond),
		f.Enqueued, f.EnqueuesLost, f.Completed, f.CompletionsLost, f.Stuck, f.FinishedTwice, f.Overlaps)
}

// failoverLog is what the producers and the handler saw, under one lock.
type failoverLog struct {
	mu        sync.Mutex
	acked     map[string]time.Time // enqueue acknowledged, when
	running   map[string]int
	started   map[string][]time.Time // run starts per ID
	completed map[string][]time.Time // acknowledged completions per ID, with their run's start
	rerun     map[string]bool        // ran again after an acknowledged completion
	twice     int
	twiceLog  []string
	overlaps  int
	firstAck  map[int]time.Time // per producer: first acknowledgement after the promotion
	workBack  time.Time         // first acknowledged completion of an affected job after the promotion
	promoted  time.Time
}

const failoverProducers = 4

func runFailover(t *testing.T, c failoverCase) failoverFigures {
	t.Helper()
	ctx := context.Background()
	cfg := c.cfg
	cfg.Prefix = redistest.Prefix(t)
	cfg.Lease = time.Second
	cfg.Logger = quiet
	q, err := NewQueue(c.rdb, "q", &cfg)
	require.NoError(t, err)
	if c.prepare != nil {
		c.affected = c.prepare(t, q)
	}
	l := &failoverLog{acked: map[string]time.Time{}, running: map[string]int{}, started: map[string][]time.Time{},
		completed: map[string][]time.Time{}, rerun: map[string]bool{}, firstAck: map[int]time.Time{}}
	payload := []byte(strings.Repeat("x", c.payload))

	var stopProducers atomic.Bool
	var producers sync.WaitGroup
	for p := range failoverProducers {
		producers.Add(1)
		go func() {
			defer producers.Done()
			for n := 0; !stopProducers.Load(); n++ {
				id := fmt.Sprintf("p%d-%d", p, n)
				for !stopProducers.Load() { // the same ID until acknowledged
					cctx, cancel := context.WithTimeout(ctx, time.Second)
					_, err := q.Enqueue(cctx, "t", payload, &EnqueueOpts{ID: id})
					cancel()
					if err == nil || errors.Is(err, ErrJobExists) {
						now := time.Now()
						l.mu.Lock()
						l.acked[id] = now
						if !l.promoted.IsZero() && now.After(l.promoted) && l.firstAck[p].IsZero() {
							l.firstAck[p] = now
						}
						l.mu.Unlock()
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}

	wctx, stopWork := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			l.mu.Lock()
			if l.running[j.ID] > 0 {
				l.overlaps++
			}
			l.running[j.ID]++
			l.started[j.ID] = append(l.started[j.ID], time.Now())
			if len(l.completed[j.ID]) > 0 {
				l.rerun[j.ID] = true
			}
			l.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			l.mu.Lock()
			l.running[j.ID]--
			l.mu.Unlock()
			return nil, nil
		}), &WorkOpts{Concurrency: 8, PollInterval: 20 * time.Millisecond, Logger: quiet, OnRecorded: func(j *Job, err error) {
			if err != nil || j.State != StateSucceeded {
				return // not recorded, or a claim given back unrun
			}
			now := time.Now()
			l.mu.Lock()
			defer l.mu.Unlock()
			starts := l.started[j.ID]
			if prev := l.completed[j.ID]; len(prev) > 0 && len(starts) > 0 && starts[len(starts)-1].Before(prev[len(prev)-1]) {
				l.twice++ // this run began before the last acknowledged completion of the job
				l.twiceLog = append(l.twiceLog, fmt.Sprintf("%s: runs began %v, completions acknowledged %v, now %v, promoted %v",
					j.ID, stamps(starts), stamps(prev), stamps([]time.Time{now}), stamps([]time.Time{l.promoted})))
			}
			l.completed[j.ID] = append(l.completed[j.ID], now)
			if !l.promoted.IsZero() && now.After(l.promoted) && l.workBack.IsZero() && c.affected(j.ID) {
				l.workBack = now
			}
		}})
	}()

	time.Sleep(1500 * time.Millisecond) // load before the fault
	killed, promoted := c.fail(t)
	l.mu.Lock()
	l.promoted = promoted
	l.mu.Unlock()
	// The load goes on until every producer and the workers of the killed
	// master's jobs are back, and a second more; 30 s at most (a loaded
	// machine's replicas take their time to resync, and a producer under
	// MinReplicas waits for them).
	back := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.firstAck) == failoverProducers && !l.workBack.IsZero()
	}
	deadline := time.Now().Add(30 * time.Second)
	for !back() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	stopProducers.Store(true)
	producers.Wait()

	// Leases lost with the master run out and claimers take their jobs
	// over: the queue drains, or what is left is stuck.
	var st Stats
	drained := time.Now().Add(15 * time.Second)
	for time.Now().Before(drained) {
		if st, err = q.Stats(ctx); err == nil && st.Pending+st.Active == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Pending+st.Active > 0 { // name what is left, for the failure
		for _, state := range []State{StatePending, StateActive} {
			page, _ := q.List(ctx, ListOpts{State: state, Limit: 10})
			for _, j := range page.Jobs {
				t.Logf("left %s: %s, run at %v, lease until %v", state, j.ID, j.RunAt, j.LeaseUntil)
			}
		}
	}
	stopWork()
	require.NoError(t, <-werr)

	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.twiceLog {
		t.Log("finished twice: " + line)
	}
	f := failoverFigures{Enqueued: len(l.acked), Stuck: int(st.Pending + st.Active), FinishedTwice: l.twice,
		Overlaps: l.overlaps, Promoted: promoted.Sub(killed)}
	backAt := func(at time.Time) time.Duration {
		if at.IsZero() {
			return -1 // never
		}
		return at.Sub(promoted)
	}
	f.ProducersBack = 0
	for p := range failoverProducers {
		d := backAt(l.firstAck[p])
		if d < 0 || f.ProducersBack < 0 {
			f.ProducersBack = -1
			continue
		}
		f.ProducersBack = max(f.ProducersBack, d)
	}
	f.WorkersBack = backAt(l.workBack)
	if err != nil {
		t.Fatalf("the queue cannot be read 15s after the load stopped: %v (%s)", err, f)
	}
	for id := range l.acked {
		j, err := q.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			f.EnqueuesLost++
		case err != nil:
			t.Fatalf("get %s: %v", id, err)
		}
		if len(l.completed[id]) == 0 {
			continue
		}
		f.Completed++
		if l.rerun[id] || j == nil || j.State != StateSucceeded {
			f.CompletionsLost++
		}
	}
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "nothing half-written")
	return f
}

// requireFailoverTargets holds what a failover must never do, whatever
// MinReplicas: leave a job stuck, finish one run twice, overlap two runs
// of a job, or keep the queue away for more than resumeWithin after the
// promotion.
func requireFailoverTargets(t *testing.T, f failoverFigures) {
	t.Helper()
	t.Log(f)
	require.Zero(t, f.Stuck, "stuck after the failover")
	require.Zero(t, f.FinishedTwice, "a run finished twice")
	require.Zero(t, f.Overlaps, "overlapping runs")
	require.GreaterOrEqual(t, f.ProducersBack, time.Duration(0), "every producer makes progress again")
	require.GreaterOrEqual(t, f.WorkersBack, time.Duration(0), "the killed master's jobs are worked again")
	require.LessOrEqual(t, f.ProducersBack, resumeWithin, "producers back after the promotion")
	require.LessOrEqual(t, f.WorkersBack, resumeWithin, "workers back after the promotion")
}

// resumeWithin is how soon after a promotion the queue must be back. It
// tells jobkey's own recovery (a slot map reloaded within
// cluster.ReloadEvery of a failed call, outcomes retried within a second)
// from waiting on go-redis, whose own reload of a cluster's slot map comes
// a minute later. On a quiet machine every case was back within 1.1 s;
// under CI's full -race run, on a machine ten times slower (175 enqueues
// acknowledged where a quiet -race run of the same test had 1,542),
// workers took 2.06 s, which is the machine, not the recovery. 5 s leaves
// that run more than twice its time and still fails a recovery four
// times slower than a quiet machine's.
const resumeWithin = 5 * time.Second

// replicaStall is how long the replica is stalled, starting stallLead
// before the master is killed, with the master's link to it dropped: the
// master's writes of that moment are on the master alone and die with it.
const (
	replicaStall = 300 * time.Millisecond
	stallLead    = 100 * time.Millisecond
)

func stallAndKill(t *testing.T, replica, master *redistest.Server) time.Time {
	t.Helper()
	resumed, err := replica.Stall(replicaStall)
	require.NoError(t, err)
	// The master's link to it goes too: what the master writes from now
	// on is not in the replica's socket when it wakes, as it would not be
	// after a partition.
	require.NoError(t, master.DropReplicas(context.Background()))
	time.Sleep(stallLead)
	killed := time.Now()
	master.Crash()
	t.Cleanup(func() { <-resumed })
	return killed
}

func sentinelFailover(t *testing.T, cfg Config, replicas int) failoverFigures {
	t.Helper()
	s := redistest.StartSentinel(t, replicas)
	rdb := s.Client(t, func(o *redis.FailoverOptions) { o.DialTimeout = 300 * time.Millisecond })
	return runFailover(t, failoverCase{rdb: rdb, cfg: cfg, payload: 1 << 10,
		affected: func(string) bool { return true },
		fail: func(t *testing.T) (time.Time, time.Time) {
			killed := stallAndKill(t, s.Replicas[0], s.Master)
			_, promoted, err := s.WaitPromoted(context.Background(), s.Master, 20*time.Second)
			require.NoError(t, err)
			return killed, promoted
		}})
}

func clusterFailover(t *testing.T, cfg Config, n int) failoverFigures {
	t.Helper()
	cl := redistest.StartClusterWithReplicas(t, 3, n)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout = 300 * time.Millisecond })
	master := cl.Masters()[0]
	replicas := cl.ReplicasOf(master)
	require.Len(t, replicas, n)
	c := failoverCase{rdb: rdb, cfg: cfg, payload: 16 << 10}
	c.prepare = func(t *testing.T, q *Queue) func(string) bool {
		on := map[int]bool{}
		for s := range q.ks.shards {
			node, err := rdb.MasterForKey(context.Background(), q.ks.index(s, idxReady))
			require.NoError(t, err)
			on[s] = node.Options().Addr == master.Addr
		}
		require.Contains(t, slices.Collect(maps.Values(on)), true, "a shard on the master to kill")
		return func(id string) bool { return on[q.ks.shardOf(id)] }
	}
	c.fail = func(t *testing.T) (time.Time, time.Time) {
		killed := stallAndKill(t, replicas[0], master)
		promoted, err := cl.WaitOnePromoted(20*time.Second, replicas...)
		require.NoError(t, err)
		return killed, promoted
	}
	return runFailover(t, c)
}

// Producers and Work on a master with a replica watched by three
// Sentinels, through a FailoverClient, lose the master: with MinReplicas 0
// the last acknowledged writes may be lost (measured, logged), but nothing
// is stuck, no run overlaps or finishes twice, and the queue is back within
// resumeWithin of the promotion.
func TestFailoverSentinelUnderLoad(t *testing.T) {
	t.Parallel()
	requireFailoverTargets(t, sentinelFailover(t, Config{}, 1))
}

// The same on a cluster of three masters with a replica each: the killed
// master's shards are served by the promoted replica within resumeWithin,
// not when go-redis reloads its slot map on its own a minute later.
func TestFailoverClusterUnderLoad(t *testing.T) {
	t.Parallel()
	requireFailoverTargets(t, clusterFailover(t, Config{}, 1))
}

func stamps(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Format("05.000")
	}
	return out
}

// With MinReplicas 1 every write is acknowledged only once a replica has
// it, so the same failover loses no acknowledged enqueue and reverts no
// acknowledged completion: the writes of the stalled moment return
// ErrNotReplicated (or fail with the master), the producers retry their
// IDs and Work retries its outcomes on the promoted replica. It takes two
// replicas: after the promotion the new master needs a replica of its own
// to confirm anything, and with one replica every write after the
// failover would be ErrNotReplicated (Work then renews its runs and
// retries their outcomes, and nothing finishes, until a replica is back).
func TestFailoverSentinelWithMinReplicasLosesNothing(t *testing.T) {
	t.Parallel()
	f := sentinelFailover(t, Config{MinReplicas: 1, ReplicaTimeout: 500 * time.Millisecond}, 2)
	requireFailoverTargets(t, f)
	require.Zero(t, f.EnqueuesLost, "acknowledged enqueues lost")
	require.Zero(t, f.CompletionsLost, "acknowledged completions lost")
}

// The same on a cluster of three masters with a replica each.
func TestFailoverClusterWithMinReplicasLosesNothing(t *testing.T) {
	t.Parallel()
	f := clusterFailover(t, Config{MinReplicas: 1, ReplicaTimeout: 500 * time.Millisecond}, 2)
	requireFailoverTargets(t, f)
	require.Zero(t, f.EnqueuesLost, "acknowledged enqueues lost")
	require.Zero(t, f.CompletionsLost, "acknowledged completions lost")
}
