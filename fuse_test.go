package jobkey

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Completing a job and claiming the next one, read ahead by the claim
// before, costs two round trips for both.
func TestCompleteAndClaimRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, id := range []string{"a", "b"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	first, err := f.q.Claim(f.ctx, "w") // reads both; the other waits in the pool
	require.NoError(t, err)
	f.hook.Reset()
	out, err := f.q.completeAndClaim(f.ctx, first, []byte("r"), "w")
	require.NoError(t, err)
	require.EqualValues(t, 2, f.hook.RTT.Load(), "WATCH+GET of both with TIME and the read ahead; MULTI..EXEC")
	t.Logf("complete and claim: %d round trips, %d commands", f.hook.RTT.Load(), f.hook.Cmds.Load())
	require.Equal(t, StateSucceeded, out.done.State)
	require.Equal(t, []byte("r"), out.done.Result)
	require.NotNil(t, out.next)
	require.NotEqual(t, first.ID, out.next.ID)
	require.Equal(t, StateActive, out.next.State)
	f.requireIndexed(t, out.done)
	f.requireIndexed(t, out.next)

	// Nothing left to claim: the completion alone.
	out, err = f.q.completeAndClaim(f.ctx, out.next, nil, "w")
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, out.done.State)
	require.Nil(t, out.next)
}

// The fused transaction interrupted at each step loses nothing and does
// nothing twice (issue 12): its reply is lost, the finished job's lease
// was lost, the candidate was taken by someone else.
func TestCompleteAndClaimInterrupted(t *testing.T) {
	t.Parallel()

	t.Run("reply lost", func(t *testing.T) {
		t.Parallel()
		cut, proxy := proxied(t)
		const lease = 500 * time.Millisecond
		q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: lease})
		ctx := context.Background()
		for _, id := range []string{"a", "b"} {
			_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id})
			require.NoError(t, err)
		}
		first, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		proxy.Set(faultproxy.Faults{ExecCutProb: 1})
		out, err := q.completeAndClaim(ctx, first, []byte("r"), "w")
		proxy.Set(faultproxy.Faults{})
		require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC ran; its reply was lost")
		done, err := q.Complete(ctx, first, []byte("r"))
		require.NoError(t, err, "the retried completion finds its own write")
		require.Equal(t, StateSucceeded, done.State)
		require.Equal(t, []byte("r"), done.Result)
		other := "b"
		if first.ID == "b" {
			other = "a"
		}
		// The claim the lost EXEC made is handed over as unsure, found by
		// its lease token, and run by the slot; nobody else can take the
		// job while its lease runs.
		require.Nil(t, out.next)
		require.NotNil(t, out.unsure)
		next := (&worker{q: q}).findClaim(ctx, out.unsure, time.Now())
		require.NotNil(t, next)
		require.Equal(t, other, next.ID)
		_, err = q.Claim(ctx, "w2")
		require.ErrorIs(t, err, ErrNoJob)
		_, err = q.Complete(ctx, next, nil)
		require.NoError(t, err)
		require.Equal(t, 1, next.Attempt, "claimed once")
	})

	t.Run("lease lost", func(t *testing.T) {
		t.Parallel()
		f := setup(t, nil)
		for _, id := range []string{"a", "b"} {
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
			require.NoError(t, err)
		}
		first, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		f.clock.Advance(31 * time.Second) // the lease runs out, and another process takes the job
		elsewhere, err := NewQueue(f.rdb, "q", &f.q.cfg)
		require.NoError(t, err)
		elsewhere.clock.fake = f.clock.Now
		var thief *Job
		for thief == nil { // the thief takes the job; the others it takes go back
			j, err := elsewhere.Claim(f.ctx, "thief")
			require.NoError(t, err)
			if j.ID == first.ID {
				thief = j
				continue
			}
			_, err = elsewhere.Release(f.ctx, j)
			require.NoError(t, err)
		}
		out, err := f.q.completeAndClaim(f.ctx, first, []byte("stale"), "w")
		require.ErrorIs(t, err, ErrLeaseLost, "the stale completion is fenced off")
		require.NotNil(t, out.next, "the slot still gets its next job")
		require.NotEqual(t, first.ID, out.next.ID)
		got, err := f.q.Get(f.ctx, first.ID)
		require.NoError(t, err)
		require.Equal(t, StateActive, got.State)
		require.Equal(t, "thief", got.LeaseOwner)
		require.Nil(t, got.Result)
	})

	t.Run("candidate taken", func(t *testing.T) {
		t.Parallel()
		f := setup(t, nil)
		for _, id := range []string{"a", "b"} {
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
			require.NoError(t, err)
		}
		first, err := f.q.Claim(f.ctx, "w") // the other is in the pool now
		require.NoError(t, err)
		other, err := NewQueue(f.rdb, "q", &f.q.cfg) // another process, with a pool of its own
		require.NoError(t, err)
		other.clock.fake = f.clock.Now
		taken, err := other.Claim(f.ctx, "other-worker")
		require.NoError(t, err)
		require.NotEqual(t, first.ID, taken.ID)
		out, err := f.q.completeAndClaim(f.ctx, first, nil, "w")
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, out.done.State)
		require.Nil(t, out.next, "the candidate is someone else's now")
		got, err := f.q.Get(f.ctx, taken.ID)
		require.NoError(t, err)
		require.Equal(t, "other-worker", got.LeaseOwner)
		require.Equal(t, 1, got.Attempt, "claimed once")
	})
}

// The round-trip budget of a worker draining a backlog (issue 12): each
// job costs one fused transaction of two round trips, finishing it and
// claiming the next, plus the queue's periodic reads. Every job runs once.
func TestWorkRoundTripsPerJob(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb, hook := hooked(t, 0)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), Logger: quietLog()})
	require.NoError(t, err)
	ctx := context.Background()
	const n = 300
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Payload: []byte{byte(i)}}
	}
	_, err = q.EnqueueMany(ctx, specs)
	require.NoError(t, err)

	var runs sync.Map
	var total atomic.Int64
	hook.Reset()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			c, _ := runs.LoadOrStore(j.ID, new(atomic.Int32))
			c.(*atomic.Int32).Add(1)
			if total.Add(1) == n {
				stop()
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1, TrimInterval: -1, Logger: quietLog()})
	}()
	require.NoError(t, <-done)
	rtt := hook.RTT.Load()
	perJob := float64(rtt) / n
	t.Logf("one slot drained %d jobs in %d round trips: %.2f per job", n, rtt, perJob)
	require.LessOrEqual(t, perJob, 2.5, "the budget of docs/design.md: 2 per job, fused")
	runs.Range(func(_, v any) bool {
		require.EqualValues(t, 1, v.(*atomic.Int32).Load())
		return true
	})
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n, st.Succeeded, "the last success is recorded at shutdown too")
}

// A read ahead made while claims were in flight does not hand their
// candidates out again: two transactions watching one candidate would
// both be retried.
func TestDuePoolForgetsNothingTakenLately(t *testing.T) {
	var p duePool
	a, b, c := candidate{id: "a"}, candidate{id: "b"}, candidate{id: "c"}
	p.fill([]candidate{a, b})
	first := p.take(1, -1) // at random within a priority
	require.Len(t, first, 1)
	p.fill([]candidate{a, b, c}) // read while the first's claim was in flight
	rest := []candidate{a, b, c}
	rest = slices.DeleteFunc(rest, func(x candidate) bool { return x == first[0] })
	require.ElementsMatch(t, rest, p.take(5, -1))
	require.Empty(t, p.take(5, -1))
	p.fill([]candidate{{id: "d", shard: 1}, {id: "e", shard: 2}})
	require.Equal(t, []candidate{{id: "e", shard: 2}}, p.take(5, 2), "only the shard asked for")
	// Candidates taken and not tried go back, and are handed out again.
	got := p.take(5, -1)
	require.Equal(t, []candidate{{id: "d", shard: 1}}, got)
	p.putBack(got)
	require.Equal(t, got, p.take(5, -1))
	// Higher priorities are handed out first.
	lo, hi := candidate{id: "lo", prio: 0}, candidate{id: "hi", prio: 3}
	p.fill([]candidate{lo, hi})
	require.Equal(t, []candidate{hi}, p.take(1, -1))
	p.drop()
	require.Empty(t, p.take(5, -1), "dropped")
}

// One job finished twice in one batch (two slots holding it, one of them
// stale) gets a transaction of its own; the other callers' completions and
// next jobs are not refused for it.
func TestFinishBatchWithOneJobTwice(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, id := range []string{"a", "b", "c", "d"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	a, err := f.q.Claim(f.ctx, "w1")
	require.NoError(t, err)
	b, err := f.q.Claim(f.ctx, "w2")
	require.NoError(t, err)
	mk := func(j *Job, worker string) *call[finishIn, finishOut] {
		return &call[finishIn, finishOut]{ctx: f.ctx, in: finishIn{job: j, result: []byte("r"), worker: worker}, done: make(chan struct{})}
	}
	calls := []*call[finishIn, finishOut]{mk(a, "w1"), mk(a, "w1"), mk(b, "w2")}
	f.q.flushFinishes(f.ctx, calls)
	for _, c := range calls {
		<-c.done
	}
	require.NoError(t, calls[0].err)
	require.Equal(t, StateSucceeded, calls[0].out.done.State)
	require.NoError(t, calls[2].err, "b's completion is not refused for a's repeat")
	require.Equal(t, StateSucceeded, calls[2].out.done.State)
	require.NotNil(t, calls[2].out.next, "and b's slot gets its next job")
	// The repeat recognises the completion already written.
	require.NoError(t, calls[1].err)
}

// A candidate read ahead before its shard's index broke does not fail the
// claim: the next round reads the indexes, skips the broken shard, and
// takes a due job of another (found in review).
func TestClaimSkipsPooledCandidateOfBrokenShard(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, Logger: quietLog()})
	ids := map[int][]string{}
	for i := 0; len(ids[0]) < 1 || len(ids[1]) < 1; i++ {
		id := fmt.Sprintf("j%d", i)
		if s := f.q.ks.shardOf(id); len(ids[s]) < 1 {
			ids[s] = append(ids[s], id)
		}
	}
	for _, id := range append(ids[0], ids[1]...) {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	// The pool holds a shard-0 job, read ahead a moment ago.
	f.q.pool.fill([]candidate{{shard: 0, id: ids[0][0], index: idxReady}})
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(0, idxReady), "not a zset", 0).Err())
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "shard 1 still has a due job")
	require.Equal(t, 1, f.q.ks.shardOf(j.ID))
}
