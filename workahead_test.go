package jobkey

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// burn enqueues n jobs and runs them to the end with nop handlers on
// Concurrency slots and prefetch, counting each job's runs; it returns the
// Queue's metrics once every job succeeded.
func burn(t *testing.T, n, slots, prefetch int) MetricsSnapshot {
	t.Helper()
	q := realQueue(t, nil)
	ctx := context.Background()
	for range n {
		_, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		return nil, nil
	}), &WorkOpts{Concurrency: slots, Prefetch: prefetch})
	waitFor(t, "every job succeeded", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == int64(n)
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, n)
	for id, k := range runs {
		require.Equal(t, 1, k, "job %s ran %d times", id, k)
	}
	return q.Metrics()
}

// largest returns the upper bound of the largest bucket of s that counted
// a batch (BatchSizes.Buckets[i]: more than 2^(i-1), at most 2^i calls).
func largest(s BatchSizes) int {
	for i := len(s.Buckets) - 1; i >= 0; i-- {
		if s.Buckets[i] > 0 {
			return 1 << i
		}
	}
	return 0
}

func TestWorkWritesManyRunsSuccessesInOneTransaction(t *testing.T) {
	t.Parallel()
	const slots = 2
	m := burn(t, 300, slots, 0)
	require.Positive(t, m.Prefetched, "jobs were claimed ahead of the slots")
	require.Greater(t, largest(m.FinishBatches), slots,
		"a transaction finished more runs than there are slots: %+v", m.FinishBatches)
	require.EqualValues(t, 300, m.Succeeded)

	// Without it, a transaction finishes at most one run per slot.
	off := burn(t, 100, slots, -1)
	require.Zero(t, off.Prefetched)
	require.LessOrEqual(t, largest(off.FinishBatches), slots, "%+v", off.FinishBatches)
}

func TestWorkGivesBackTheJobsHeldAheadWhenItStops(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	var ids []string
	for range 100 {
		j, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	var handled atomic.Int32
	var held atomic.Bool
	reached, proceed := make(chan struct{}), make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := handled.Add(1)
		if held.Load() || n < 10 {
			return nil, nil
		}
		// Whether a job is held ahead at a given run depends on how fast
		// the slot has been finishing: the one slot stops at the first
		// run past a warm-up that sees one. With one slot, an active job
		// other than this one is held ahead.
		st, err := q.Stats(ctx)
		if err != nil || st.Active < 2 {
			return nil, err
		}
		held.Store(true)
		close(reached)
		<-proceed // holds the one slot while Work stops
		return nil, nil
	}), &WorkOpts{Concurrency: 1, Prefetch: 4})
	waitFor(t, "a run while a job is held ahead", held.Load)
	<-reached
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(20 * time.Millisecond) // Work's ctx has ended: what it holds ahead goes back
	close(proceed)
	<-stopped
	m := q.Metrics()
	require.Positive(t, m.Prefetched)
	require.Positive(t, m.PrefetchReturned, "the jobs held ahead went back unrun")
	var succeeded int32
	for _, id := range ids {
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		switch j.State {
		case StateSucceeded:
			succeeded++
		case StatePending:
			require.Zero(t, j.Attempt, "job %s went back with its attempt unspent", id)
		default:
			t.Fatalf("job %s is %s once Work returned", id, j.State)
		}
	}
	require.Equal(t, handled.Load(), succeeded, "every run that returned was recorded, and no other")
}

func TestWorkGivesBackTheJobsHeldAheadWhileEverySlotRunsLong(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	const n = 60
	for range n {
		_, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var handled atomic.Int32
	started, proceed := make(chan struct{}), make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if handled.Add(1) == 20 {
			close(started)
			<-proceed // the one slot runs long
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1, Prefetch: 2})
	defer stop()
	<-started
	// While the one slot is busy, this Work holds no job but the one it
	// runs: what it held ahead goes back, for another worker to take.
	waitFor(t, "the jobs held ahead given back", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Active == 1 && q.Metrics().PrefetchReturned > 0
	})
	close(proceed)
	waitFor(t, "every job succeeded", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == n
	})
	require.EqualValues(t, n, handled.Load(), "each job ran once")
}

// A spell of slow transactions does not turn bulk finishing off for good.
// The feeder records on its own, with retries, a success whose lease is
// nearly out by its estimate of a transaction's duration; that estimate
// is measured only by transactions it makes, so once it exceeded what any
// fresh run has left, every later success went on its own and the
// estimate was never measured again: no transaction wrote more than one
// run, and no job was claimed ahead, for the rest of the Work's life.
func TestWorkFinishesInBulkAgainAfterASpellOfSlowTransactions(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	var slow atomic.Bool
	var stalled atomic.Int64
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slow.Load() && has(cmds, "zadd", ":succeeded") {
			stalled.Add(1)
			time.Sleep(900 * time.Millisecond) // completions stall, past what ctx allows
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second, Logger: quietLog()})
	ctx := context.Background()
	enqueue := func(n int) {
		specs := make([]JobSpec, n)
		for i := range specs {
			specs[i] = JobSpec{Type: "t"}
		}
		_, err := q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
	}
	enqueue(200)
	const slots = 2
	slow.Store(true)
	stop := startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: slots, PollInterval: 20 * time.Millisecond})
	defer stop()
	waitForIn(t, 30*time.Second, "a slow bulk transaction", func() bool { return q.Metrics().FinishBatches.Flushes >= 1 })
	time.Sleep(6 * time.Second) // the feeder's estimate of a transaction's duration grows
	slow.Store(false)
	waitForIn(t, 30*time.Second, "the first jobs done", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Pending+st.Active == 0
	})
	before := q.Metrics()
	enqueue(300)
	waitForIn(t, 30*time.Second, "the next jobs done", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Pending+st.Active == 0
	})
	after := q.Metrics()
	t.Logf("%d writes stalled; before: %+v; after: %+v", stalled.Load(), before.FinishBatches, after.FinishBatches)
	batches := after.FinishBatches.Sub(before.FinishBatches)
	require.Greater(t, largest(batches), slots, "a transaction finished more runs than there are slots once Redis was fast again: %+v", batches)
	require.Positive(t, after.Prefetched-before.Prefetched, "jobs were claimed ahead again")
}

// Through a link that resets connections and loses the replies to EXECs,
// Work's bulk finishes drain the queue: a bulk transaction whose reply was
// lost has its completions recorded again (each recognises its own write)
// and its claims ahead looked for by their lease tokens. No job runs twice
// at once, each succeeds once, by its last run, each run's outcome is
// reported once, and a job runs again only as leaseLog allows.
func TestBulkFinishesThroughLostRepliesAndResetsFinishEachJobOnce(t *testing.T) {
	t.Parallel()
	m, counts := drainThroughLostReplies(t, 0, 0.1)
	t.Logf("prefetched %d, given back %d; proxy %+v", m.Prefetched, m.PrefetchReturned, counts)
	require.Positive(t, m.Prefetched, "jobs were claimed ahead")
}

// carries reports a pipeline with an EXEC that writes a value holding mark.
func carries(cmds []redis.Cmder, mark string) bool {
	exec := false
	found := false
	for _, c := range cmds {
		exec = exec || c.Name() == "exec"
		for _, a := range c.Args() {
			switch a := a.(type) {
			case []byte:
				found = found || bytes.Contains(a, []byte(mark))
			case string:
				found = found || strings.Contains(a, mark)
			}
		}
	}
	return exec && found
}

// A success waiting in the feeder's queue while the feeder is stalled
// behind a slow transaction keeps its lease renewed as any run's is: a
// renewal that takes a while (Redis slow to answer it) still lands before
// the run's deadline, the success is written, and no other worker runs
// the job again. Counting the waiting success as a write in flight left
// its first renewal to when less than half the lease was left, too late
// for a renewal that took two fifths of one: the run was fenced with its
// success unwritten, its lease ran out, and another worker ran the job.
func TestASuccessWaitingForTheFeederKeepsItsLeaseRenewed(t *testing.T) {
	t.Parallel()
	// Scaled up from 300 ms, then from 1 s: a loaded CI machine kept a's
	// run from stalling the feeder, and later ran b twice.
	const lease = 2 * time.Second
	rdb := redistest.Client(t, nil)
	var stallOnce, bDone atomic.Bool
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		switch {
		case carries(cmds, "stall-this-finish") && stallOnce.CompareAndSwap(false, true):
			time.Sleep(2 * lease) // the feeder's transaction hangs, past its deadline
		case bDone.Load() && carries(cmds, "job-b-payload") && !carries(cmds, "job-a-payload") &&
			has(cmds, "zadd", ":leased") && !has(cmds, "zadd", ":succeeded"):
			// Job b's renewals are slow to answer when they go alone (one
			// that rides with a's, whose lease the stall leaves short, would
			// be cut short with it).
			return sleepCtxOr(ctx, lease*2/5)
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: lease, Logger: quietLog()})
	ctx := context.Background()
	a, err := q.Enqueue(ctx, "a", []byte("job-a-payload"), nil)
	require.NoError(t, err)
	// b is due once a's success has stalled the feeder: its renewals do not
	// coincide with a's, whose run the stall keeps in flight.
	b, err := q.Enqueue(ctx, "b", []byte("job-b-payload"), &EnqueueOpts{Delay: lease / 10})
	require.NoError(t, err)
	var runsB atomic.Int64
	handedOver := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if j.ID == a.ID {
			time.Sleep(lease / 5)
			return []byte("stall-this-finish"), nil
		}
		time.Sleep(lease / 5)
		if runsB.Add(1) == 1 {
			defer close(handedOver)
		}
		bDone.Store(true)
		return nil, nil
	})
	stop := startWork(t, q, h, &WorkOpts{Concurrency: 2, LeaseMargin: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	defer stop()
	<-handedOver
	// Another worker takes any job whose lease ran out.
	other := queueOn(t, redistest.Client(t, nil), q.cfg.Prefix, Config{Lease: lease, Logger: quietLog()})
	stopOther := startWork(t, other, h, &WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond, Prefetch: -1})
	defer stopOther()
	waitForIn(t, 10*time.Second, "job b succeeded", func() bool {
		j, err := q.Get(ctx, b.ID)
		require.NoError(t, err)
		return j.State == StateSucceeded
	})
	require.True(t, stallOnce.Load(), "a's transaction stalled the feeder")
	require.EqualValues(t, 1, runsB.Load(), "job b ran once")
}
