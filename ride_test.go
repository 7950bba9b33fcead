package jobkey

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// rideHook runs f on every pipeline that carries a ride (a WATCH after an
// EXEC), around the call that sends it.
type rideHook func(ctx context.Context, cmds []redis.Cmder, send func() error) error

func (h rideHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h rideHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h rideHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !carriesRide(cmds) {
			return next(ctx, cmds)
		}
		return h(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}

// carriesRide reports a pipeline with a WATCH after its EXEC.
func carriesRide(cmds []redis.Cmder) bool {
	exec := false
	for _, c := range cmds {
		switch c.Name() {
		case "exec":
			exec = true
		case "watch":
			if exec {
				return true
			}
		}
	}
	return false
}

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
		}), &WorkOpts{Concurrency: slots, TrimInterval: -1, Logger: quietLog()})
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
	off.finishes.rides = false
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
	rdb.AddHook(rideHook(func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
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
	rdb.AddHook(rideHook(func(ctx context.Context, cmds []redis.Cmder, send func() error) error {
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
