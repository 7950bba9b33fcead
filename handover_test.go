package jobkey

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// burnDown enqueues n jobs and drains them with Work's slots, returning
// how many times each ran and the queue's metrics over the drain.
func burnDown(t *testing.T, q *Queue, n, slots int) (runs map[string]int, m MetricsSnapshot) {
	t.Helper()
	ctx := context.Background()
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Payload: []byte{byte(i)}}
	}
	_, err := q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	before := q.Metrics()
	var mu sync.Mutex
	runs = map[string]int{}
	var total atomic.Int64
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			mu.Lock()
			runs[j.ID]++
			mu.Unlock()
			if total.Add(1) >= int64(n) {
				stop()
			}
			return nil, nil
		}), &WorkOpts{Concurrency: slots, TrimInterval: -1, Logger: quietLog(), Prefetch: -1})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the burn-down did not finish")
	}
	after := q.Metrics()
	m = MetricsSnapshot{Rides: after.Rides - before.Rides, Conflicts: after.Conflicts - before.Conflicts,
		RoundTrips: after.RoundTrips - before.RoundTrips}
	return runs, m
}

// requireOnceEach checks that each of n jobs ran once and is recorded as
// succeeded.
func requireOnceEach(t *testing.T, q *Queue, runs map[string]int, n int) {
	t.Helper()
	require.Len(t, runs, n, "every job ran")
	for id, c := range runs {
		require.Equal(t, 1, c, "job %s ran %d times", id, c)
	}
	waitFor(t, "every success recorded", func() bool {
		st, err := q.Stats(context.Background())
		return err == nil && st.Succeeded == int64(n)
	})
}

// Work's slots come back to finish one after another: the next batch's
// round trip 1 rides behind the EXEC before it, so a busy connection pays
// about one round trip per batch, and every job still runs once.
func TestWorkSlotsRideTheNextReadBehindEachEXEC(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	const n, slots = 600, 8
	q := queueOn(t, redistest.Client(t, nil), redistest.Prefix(t), Config{Logger: quietLog()})
	runs, m := burnDown(t, q, n, slots)
	t.Logf("%d jobs on %d slots: %d rides, %d engine round trips (%.2f per job), %d conflicts",
		n, slots, m.Rides, m.RoundTrips, float64(m.RoundTrips)/n, m.Conflicts)
	requireOnceEach(t, q, runs, n)
	require.Greater(t, m.Rides, int64(n/40), "reads rode behind EXECs")

	// The same drain with rides off pays a round trip of its own for
	// every read.
	off := queueOn(t, redistest.Client(t, nil), redistest.Prefix(t), Config{Logger: quietLog()})
	off.finishes.HandOver = false
	runs, m = burnDown(t, off, n, slots)
	requireOnceEach(t, off, runs, n)
	require.Zero(t, m.Rides)
}

// An EXEC that carried the next batch's read and was aborted, because a
// key it watched changed, is retried on a connection of its own; the read
// that rode behind it stands (Redis ran it after the aborted EXEC, under
// its own WATCH). Every job still runs once.
func TestRideBehindAnAbortedEXECStands(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	other := redistest.Client(t, nil)
	var aborted atomic.Int32
	rdb.AddHook(redistest.CarryHook(func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
		if aborted.Load() < 20 {
			// Rewrite, unchanged, the first job value the EXEC sets: its
			// WATCH sees a write and aborts the EXEC.
			for _, c := range cmds {
				if a := c.Args(); c.Name() == "set" && len(a) > 2 {
					key := a[1].(string)
					if v, err := other.Get(ctx, key).Bytes(); err == nil {
						if other.Set(ctx, key, v, redis.KeepTTL).Err() == nil {
							aborted.Add(1)
						}
					}
					break
				}
			}
		}
		return send()
	}))
	const n = 300
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	runs, m := burnDown(t, q, n, 8)
	t.Logf("%d EXECs with a ride aborted; %d rides, %d conflicts", aborted.Load(), m.Rides, m.Conflicts)
	require.Positive(t, aborted.Load(), "some EXEC with a ride was aborted")
	require.GreaterOrEqual(t, m.Conflicts, int64(aborted.Load()), "each aborted EXEC counts as a conflict")
	requireOnceEach(t, q, runs, n)
}

// The reply to a pipeline that carried a ride is lost after Redis ran it
// all: the EXEC's outcome is unknown to its flush, and the read behind it
// is not used: the next batch reads on a connection of its own.
// Nothing runs twice and nothing is lost.
func TestRideWhoseReplyIsLostLosesNoJobAndRunsNoneTwice(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var cut atomic.Int32
	rdb.AddHook(redistest.CarryHook(func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
		err := send()
		if err == nil && cut.Load() < 5 {
			cut.Add(1)
			for _, c := range cmds {
				c.SetErr(io.ErrUnexpectedEOF)
			}
			return io.ErrUnexpectedEOF
		}
		return err
	}))
	const n = 300
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	runs, m := burnDown(t, q, n, 8)
	t.Logf("%d replies cut; %d rides", cut.Load(), m.Rides)
	require.Positive(t, cut.Load(), "some reply to a ride was cut")
	requireOnceEach(t, q, runs, n)
}

// On a cluster each shard's transaction runs on a goroutine and a
// connection of its own, and every one of them may hand its connection to
// the next batch: every job still runs once, and no connection is used by
// two goroutines (run with -race).
func TestRideOnClusterRunsEachJobOnce(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	q := queueOn(t, cl.Client(t, nil), redistest.Prefix(t), Config{Logger: quietLog()})
	const n = 600
	runs, m := burnDown(t, q, n, 16)
	t.Logf("%d jobs: %d rides, %d conflicts", n, m.Rides, m.Conflicts)
	requireOnceEach(t, q, runs, n)
}

// watchesLeft reports how many of rdb's idle pooled connections still
// watch a key: every key under prefix is rewritten unchanged, and each
// connection then runs an empty MULTI/EXEC, which a stale WATCH aborts.
func watchesLeft(t *testing.T, rdb *redis.Client, prefix string) int {
	t.Helper()
	ctx := context.Background()
	other := redis.NewClient(rdb.Options())
	defer other.Close()
	keys, err := other.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		d, err := other.Dump(ctx, k).Result()
		require.NoError(t, err)
		require.NoError(t, other.RestoreReplace(ctx, k, 0, d).Err())
	}
	idle := int(rdb.PoolStats().IdleConns)
	conns := make([]*redis.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	stale := 0
	for range idle {
		c := rdb.Conn()
		conns = append(conns, c)
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Ping(ctx)
			return nil
		})
		if errors.Is(err, redis.TxFailedErr) {
			stale++
		} else {
			require.NoError(t, err)
		}
	}
	return stale
}

// A pipeline that carried a ride leaves no WATCH armed on a connection
// that goes back to go-redis's pool, whatever its EXEC answered: a stale
// WATCH would abort a later, unrelated transaction on that connection.
func TestRideLeavesNoWatchOnPooledConnections(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	for _, tc := range []struct {
		name string
		// hurt changes a pipeline that carries a ride before it is sent,
		// or its replies after.
		hurt func(ctx context.Context, other *redis.Client, cmds []redis.Cmder, send func() error) error
	}{
		{"clean", func(_ context.Context, _ *redis.Client, _ []redis.Cmder, send func() error) error { return send() }},
		{"aborted", func(ctx context.Context, other *redis.Client, cmds []redis.Cmder, send func() error) error {
			for _, c := range cmds {
				if a := c.Args(); c.Name() == "set" && len(a) > 2 {
					key := a[1].(string)
					if v, err := other.Get(ctx, key).Bytes(); err == nil {
						other.Set(ctx, key, v, redis.KeepTTL)
					}
					break
				}
			}
			return send()
		}},
		{"execabort", func(_ context.Context, _ *redis.Client, cmds []redis.Cmder, send func() error) error {
			for _, c := range cmds {
				if a := c.Args(); c.Name() == "set" && len(a) > 2 {
					a[0] = "nosuchcommand" // refused as it is queued: EXECABORT
					break
				}
			}
			return send()
		}},
		{"tail lost", func(_ context.Context, _ *redis.Client, cmds []redis.Cmder, send func() error) error {
			return redistest.LoseAfterEXEC(cmds, send)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Client(t, nil)
			other := redistest.Client(t, nil)
			var hurt atomic.Int32
			rdb.AddHook(redistest.CarryHook(func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
				if hurt.Add(1)%3 != 0 {
					return send()
				}
				return tc.hurt(ctx, other, cmds, send)
			}))
			prefix := redistest.Prefix(t)
			q := queueOn(t, rdb, prefix, Config{Logger: quietLog()})
			const n = 300
			runs, m := burnDown(t, q, n, 8)
			t.Logf("%d rides, %d hurt, %d conflicts", m.Rides, hurt.Load()/3, m.Conflicts)
			require.Positive(t, hurt.Load()/3, "some ride was hurt")
			for id, c := range runs {
				require.Equal(t, 1, c, "job %s ran %d times", id, c)
			}
			require.Zero(t, watchesLeft(t, rdb, prefix), "pooled connections with a WATCH armed")
		})
	}
}

// Through a link that resets connections and loses the replies to EXECs,
// Work's slots drain the queue with rides on: no job runs twice at once,
// and every one succeeds once, by its last run. A job runs again only as
// leaseLog allows: its run's outcome could not be recorded before its
// lease ran out (on a loaded machine, the completion's tries and the
// renewals through this link can all fail for a whole lease), and the
// rerun was claimed, for a later attempt, once that lease had ended. A
// claim handed to two slots, or a job run again after its completion
// landed, fails it.
func TestRideThroughLostRepliesAndResetsFinishesEachJobOnce(t *testing.T) {
	t.Parallel()
	m, counts := drainThroughLostReplies(t, -1, 0.05)
	t.Logf("%d rides; proxy %+v", m.Rides, counts)
}

// drainThroughLostReplies drains 300 jobs with Work's 8 slots (Prefetch
// prefetch) through a link that resets connections and loses the replies
// to EXECs with probability cut. It fails the test when a job runs twice
// at once, when Work does not return, when a job runs again but as
// leaseLog allows (see TestRideThroughLostRepliesAndResetsFinishesEachJobOnce),
// or when a run's outcome is reported twice; it returns the queue's
// metrics and what the proxy did.
func drainThroughLostReplies(t *testing.T, prefetch int, cut float64) (MetricsSnapshot, faultproxy.Counts) {
	t.Helper()
	rdb, proxy := proxied(t)
	// A claim whose reply was lost comes back when its lease runs out.
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog(), Lease: 2 * time.Second})
	ctx := context.Background()
	const n = 300
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: "t"}
	}
	jobs, err := q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	ids := make([]string, n)
	for i, j := range jobs {
		ids[i] = j.ID
	}
	proxy.Set(faultproxy.Faults{ExecCutProb: cut, ResetProb: 0.005})
	log := newLeaseLog()
	var mu sync.Mutex
	running := map[string]bool{}
	reported := map[uint64]int{}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			end := log.begin(j)
			defer end()
			mu.Lock()
			if running[j.ID] {
				mu.Unlock()
				t.Errorf("job %s runs twice at once", j.ID)
				return nil, nil
			}
			running[j.ID] = true
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			delete(running, j.ID)
			mu.Unlock()
			return nil, nil
		}), &WorkOpts{Concurrency: 8, TrimInterval: -1, Logger: quietLog(), Prefetch: prefetch, OnRecorded: func(j *Job, err error) {
			mu.Lock()
			reported[j.LeaseToken]++
			mu.Unlock()
			log.onRecorded(j, err)
		}})
	}()
	waitForIn(t, 90*time.Second, "every job succeeded", func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.Succeeded == n
	})
	proxy.Set(faultproxy.Faults{})
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Work did not return")
	}
	// A job may run again when its run's outcome could not be recorded
	// before its lease ran out (see leaseLog): never two runs at once, and
	// each job finished once, by its last run.
	if n := log.check(t, ctx, q, ids); n > 0 {
		t.Logf("%d reruns after a lost outcome", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for token, k := range reported {
		require.Equal(t, 1, k, "the run of lease token %d was reported %d times", token, k)
	}
	return q.Metrics(), proxy.Counts()
}

func waitForIn(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
