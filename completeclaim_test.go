package jobkey

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/readahead"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
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

// The complete-and-claim transaction interrupted at each step loses nothing and does
// nothing twice: its reply is lost, the finished job's lease
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
		elsewhere := f.twin(t)
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
		other := f.twin(t) // another process, with a pool of its own
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

// The round-trip budget of a worker draining a backlog: each
// job costs one complete-and-claim transaction of two round trips, finishing it and
// claiming the next, plus the queue's periodic reads. Every job runs once.
func TestWorkRoundTripsPerJob(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb, hook := hooked(t, 0)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	ctx := context.Background()
	const n = 300
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Payload: []byte{byte(i)}}
	}
	_, err := q.EnqueueMany(ctx, specs)
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
	mk := func(j *Job, worker string) *cas.Call[finishIn, finishOut] {
		return cas.NewCall[finishIn, finishOut](f.ctx, finishIn{job: j, result: []byte("r"), worker: worker})
	}
	calls := []*cas.Call[finishIn, finishOut]{mk(a, "w1"), mk(a, "w1"), mk(b, "w2")}
	f.q.flushFinishes(f.ctx, calls)
	out0, err0 := calls[0].Wait()
	out1, err1 := calls[1].Wait()
	out2, err2 := calls[2].Wait()
	require.NoError(t, err0)
	require.Equal(t, StateSucceeded, out0.done.State)
	require.NoError(t, err2, "b's completion is not refused for a's repeat")
	require.Equal(t, StateSucceeded, out2.done.State)
	require.NotNil(t, out2.next, "and b's slot gets its next job")
	// The repeat recognises the completion already written.
	require.NoError(t, err1)
	_ = out1
}

// A candidate read ahead before its shard's index broke does not fail the
// claim: the next round reads the indexes, skips the broken shard, and
// takes a due job of another.
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
	f.q.pool.Fill(dueView{Shards: []int{0, 1}, Cands: []candidate{{Shard: 0, ID: ids[0][0], Index: idxReady}}, At: time.Now()})
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(0, idxReady), "not a zset", 0).Err())
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "shard 1 still has a due job")
	require.Equal(t, 1, f.q.ks.shardOf(j.ID))
}

// dueJob is a job enqueued while a backlog of one shard runs: on its own
// shard, of its priority, due after its delay.
type dueJob struct {
	id    string
	prio  int
	delay time.Duration
}

// claimBound is how soon after it comes due a job is claimed while Work's
// slots keep finishing jobs (docs/design.md, "Priorities"): every shard's
// due entries are read again within 250 ms, and on a cluster a shard whose
// candidates waited 250 ms more is served by the next slot to finish.
const claimBound = 500 * time.Millisecond

// dueLatencies runs Work with 2 slots on q, whose backlog lies in one
// shard, with a handler of 10 ms; once the backlog flows, producer
// enqueues jobs, and dueLatencies returns how long after coming due each
// of them started.
func dueLatencies(t *testing.T, q, producer *Queue, jobs []dueJob) map[string]time.Duration {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	runs := 0
	started := map[string]time.Time{}
	due := map[string]time.Time{}
	all := make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		now := time.Now()
		mu.Lock()
		runs++
		if slices.ContainsFunc(jobs, func(d dueJob) bool { return d.id == j.ID }) {
			started[j.ID] = now
			if len(started) == len(jobs) {
				close(all)
			}
		}
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		return nil, nil
	}), &WorkOpts{Concurrency: 2, TrimInterval: -1})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return runs >= 20 }, 10*time.Second, time.Millisecond,
		"the backlog flows")
	for _, d := range jobs {
		j, err := producer.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: d.id, Priority: d.prio, Delay: d.delay})
		require.NoError(t, err)
		mu.Lock()
		due[d.id] = j.RunAt
		mu.Unlock()
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	out := map[string]time.Duration{}
	for _, d := range jobs {
		at, ok := started[d.id]
		require.True(t, ok, "job %s never ran", d.id)
		out[d.id] = at.Sub(due[d.id])
	}
	t.Logf("after %d runs; started after coming due: %v", runs, out)
	return out
}

// On a single Redis of 8 shards, with 300 jobs of priority 0 in one shard
// and 2 slots finishing them, a job due on any other shard, of any
// priority, is claimed within the bound: a priority-9 job that comes due
// later (no hint then), a priority-0 job due at once, and a priority-0 job
// that comes due later. The fused read ahead used to read only the
// finished job's shard, and the pool then fed every claim from it until
// the backlog was gone.
func TestWorkClaimsDueJobsOfEveryShardWithinBound(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 8, Logger: quietLog()})
	f.q.clock.Fake = nil
	producer := f.twin(t) // another process
	specs := make([]JobSpec, 300)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: idOnShard(f.q, fmt.Sprintf("b%d-", i), 0)}}
	}
	_, err := f.q.EnqueueMany(f.ctx, specs)
	require.NoError(t, err)
	jobs := []dueJob{
		{id: idOnShard(f.q, "hi-", 3), prio: MaxPriority, delay: 300 * time.Millisecond},
		{id: idOnShard(f.q, "lo-", 5), prio: 0},
		{id: idOnShard(f.q, "late-", 6), prio: 0, delay: 300 * time.Millisecond},
	}
	for id, d := range dueLatencies(t, f.q, producer, jobs) {
		require.LessOrEqual(t, d, claimBound+250*time.Millisecond, "job %s started %v after coming due", id, d)
	}
}

// Work's complete-and-claim reads ahead every shard a claim reads, not
// only the shards of the jobs it completes, so the next claim, which takes
// from the pool with no further read on a single Redis, still takes the due
// jobs of a higher priority first. Here, on 4 shards, a priority-9 job is
// enqueued on shard 1 while a shard-0 job runs, and it is the slot's next
// run, before the priority-0 jobs of shard 0.
func TestFusedReadAheadReadsEveryShard(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	f.q.clock.Fake = nil
	q := f.q
	for i := range 4 {
		_, err := q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, fmt.Sprintf("low%d-", i), 0)})
		require.NoError(t, err)
	}
	hi := idOnShard(q, "hi-", 1)
	var log runLog
	startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if log.add(j) == 1 {
			_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: hi, Priority: MaxPriority})
			if err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond) // the wake-up hint "p9" arrives too
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 1})
	got := waitRuns(t, &log, 2)
	require.Equal(t, hi, got[1].ID, "run 2 must be the due priority-9 job, got %s (priority %d, shard %d)",
		got[1].ID, got[1].Priority, q.ks.shardOf(got[1].ID))
}

// A fused complete-and-claim whose EXEC reply comes too late does not fail
// unrun the job it claimed. An unknown outcome mostly comes from a slow or
// broken link, and one look for the claim would go over the same link a
// moment later; so the slot looks for the claim itself, retrying while the
// claim's lease may hold. Here the link turns slow (300 ms, past the
// client's 200 ms read timeout) as the EXEC goes out, the lease is 2 s, and
// the claimed job, on its last attempt, is found once the link recovers,
// then run and completed. A link down for longer than the lease still spends
// the attempt, as for a plain Claim whose reply is lost: the lease has run
// out, and nobody can tell a run from none.
func TestSlowFusedReplyDoesNotFailUnrunJob(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	const lease = 2 * time.Second       // the link recovers within it
	const slow = 300 * time.Millisecond // > the proxied client's 200 ms read timeout
	var slowExec atomic.Bool
	cut.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slowExec.Load() && slices.Contains(names(cmds), "exec") {
			proxy.Set(faultproxy.Faults{Latency: slow}) // the link slows down as the EXEC goes out
		}
		return nil
	}))
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: lease, Logger: quietLog()})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, MaxAttempts: 1})
		require.NoError(t, err)
	}
	first, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	other := "b"
	if first.ID == "b" {
		other = "a"
	}
	slowExec.Store(true)
	asked := time.Now()
	out, err := q.completeAndClaim(ctx, first, []byte("r"), "w")
	slowExec.Store(false)
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC was sent; its reply came too late")
	require.NotNil(t, out.unsure)
	found := make(chan *Job, 1)
	go func() { found <- (&worker{q: q}).findClaim(ctx, out.unsure, asked) }() // as the slot does
	time.Sleep(2 * slow)                                                       // the slow episode ends; the lookup keeps trying meanwhile
	proxy.Set(faultproxy.Faults{})
	_, err = q.Complete(ctx, first, []byte("r")) // as Work's record does, with retries
	require.NoError(t, err, "the retried completion recognises its own write")
	next := <-found
	stored, err := q.Get(ctx, other)
	require.NoError(t, err)
	t.Logf("after the fused call: %s is %s, attempt %d/%d, owner %q; handed to the slot: %v",
		other, stored.State, stored.Attempt, stored.MaxAttempts, stored.LeaseOwner, next != nil)
	require.NotNil(t, next, "found once the link recovered, within the claim's lease")
	require.Equal(t, other, next.ID)
	_, err = q.Complete(ctx, next, nil)
	require.NoError(t, err, "the slot runs it and completes it: it never fails unrun")
}

// The complete-and-claim transaction's read ahead drops an ID found in both ready and
// leased (a stray entry), as the claim's due read does: one transaction must
// not decide about one job twice. A pool holding the job twice would put
// both entries into one block of the next ClaimMany (or group of concurrent
// Claims), and the engine would refuse it for naming a key twice. Here the
// read ahead sees both entries of x, and ClaimMany takes x once.
func TestClaimManyFromReadAheadWithStrayEntry(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "w") // nothing else due: the pool stays empty
	require.NoError(t, err)
	x, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	// A stray entry: x is pending in ready, and also listed in leased as due.
	past := float64(toMillis(f.clock.Now()) - 1000)
	require.NoError(t, f.rdb.ZAdd(f.ctx, f.q.Keys("x").Leased, redis.Z{Score: past, Member: "x"}).Err())

	// The fused completion (wanting no next job) reads ahead both entries of x.
	out, err := f.q.completeAndClaim(f.ctx, a, nil, "")
	require.NoError(t, err)
	require.Nil(t, out.next)

	got, err := f.q.ClaimMany(f.ctx, "w", 2)
	require.NoError(t, err, "a due job and a stray hint: the claim takes the job")
	require.Len(t, got, 1)
	require.Equal(t, x.ID, got[0].ID)
}

// A candidate taken from the read-ahead pool has its shard's index types
// checked before MULTI, like any other, though an earlier read saw those
// indexes up to poolTTL (500 ms) before. An index replaced meanwhile by a
// value of another type would otherwise let EXEC apply half the plan (the
// job set active and its ready entry removed, its leased entry refused with
// WRONGTYPE), and leave an active job in no index, which no claimer finds
// again even once the index is repaired. Here the other shard's leased index
// becomes a string while the pool holds its job: the fused claim is refused
// with ErrWrongType, nothing is written, and once the index is repaired the
// job is claimed.
func TestPooledCandidateIndexTypeCheckedBeforeMulti(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, Logger: quietLog()})
	// One job in each shard.
	ids := map[int]string{}
	for i := 0; len(ids) < 2; i++ {
		id := "j" + string(rune('a'+i))
		if _, ok := ids[f.q.ks.shardOf(id)]; !ok {
			ids[f.q.ks.shardOf(id)] = id
		}
	}
	for _, id := range ids {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	first, err := f.q.Claim(f.ctx, "w") // the other job, of the other shard, waits in the pool
	require.NoError(t, err)
	other := ids[1-f.q.ks.shardOf(first.ID)]
	leased := f.q.Keys(other).Leased
	// The other shard's leased index is replaced by a string (forged, or a
	// stray write of another program) while the pool holds its job.
	require.NoError(t, f.rdb.Set(f.ctx, leased, "not a zset", 0).Err())

	out, err := f.q.completeAndClaim(f.ctx, first, []byte("r"), "w")
	t.Logf("fused: next %v, err %v", out.next != nil, err)
	require.ErrorIs(t, err, ErrWrongType, "refused before MULTI")
	require.Nil(t, out.next)
	require.Equal(t, StatePending, state(t, f.q, other), "nothing was written")
	_, err = f.q.Complete(f.ctx, first, []byte("r")) // as Work's record does after a refused fusion
	require.NoError(t, err)

	// The index is repaired; the job must be claimable (now, or once a
	// lease it got has run out).
	require.NoError(t, f.rdb.Del(f.ctx, leased).Err())
	f.clock.Advance(f.q.cfg.Lease + time.Second)
	got, err := f.q.Claim(f.ctx, "w2")
	stored, _ := f.q.Get(f.ctx, other)
	require.NoError(t, err, "job %s is %s, in no index: nobody will ever claim it", other, stored.State)
	require.Equal(t, other, got.ID)
}

// A complete-and-claim transaction whose EXEC reply is lost does not strand the job it
// claimed for the slot. The retried completion recognises its own write, and
// the claim, whose lease token is known, is found by that token and handed
// to the slot, which runs it. A stranded claim would spend an attempt of a
// job that never ran: on its last attempt (MaxAttempts 1 here) the next
// claim after the lease would fail it for good, its handler never run.
func TestLostFusedReplyDoesNotFailUnrunJob(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	const lease = 500 * time.Millisecond
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: lease, Logger: quietLog()})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, MaxAttempts: 1})
		require.NoError(t, err)
	}
	first, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	other := "b"
	if first.ID == "b" {
		other = "a"
	}
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	out, err := q.completeAndClaim(ctx, first, []byte("r"), "w")
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC was sent; its reply was lost")
	_, err = q.Complete(ctx, first, []byte("r")) // as Work's record does
	require.NoError(t, err, "the retried completion recognises its own write")
	// The claim made by the lost EXEC is found by its lease token and
	// handed to the slot, which runs it and completes it.
	require.NotNil(t, out.unsure, "the claim the lost EXEC made is handed over, to be looked for")
	next := (&worker{q: q}).findClaim(ctx, out.unsure, time.Now())
	require.NotNil(t, next, "the claim the lost EXEC made is found by its token")
	require.Equal(t, other, next.ID)
	require.Equal(t, StateActive, next.State)
	done, err := q.Complete(ctx, next, nil)
	require.NoError(t, err, "the slot holds the lease it was handed")
	require.Equal(t, StateSucceeded, done.State)
	time.Sleep(lease + 100*time.Millisecond)
	_, err = q.Claim(ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob, "nothing stranded, nothing left to fail")
}

// sent records the commands of every pipeline a client sends, as "cmd key".
type sent struct {
	mu   sync.Mutex
	cmds []string
}

func (s *sent) hook() pipeHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.cmds = append(s.cmds, names(cmds)...)
		return nil
	}
}

// take returns the commands recorded since the last take.
func (s *sent) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.cmds
	s.cmds = nil
	return out
}

// count returns how many of cmds are of command name.
func count(cmds []string, name string) int {
	n := 0
	for _, c := range cmds {
		if c == name || strings.HasPrefix(c, name+" ") {
			n++
		}
	}
	return n
}

// A complete-and-claim transaction reads no index ahead while the pool holds twice
// the candidates its callers want, fresh: it then types the indexes it
// writes with TYPE. When it reads ahead, its ZRANGEBYSCOREs type the
// indexes they read, and no TYPE goes for those. Either way the pause
// flag (and, while the process has seen no priority, the priority flag)
// of each shard is one MGET beside the jobs' MGET, and the batch is 16
// commands: 8 in the WATCH round trip, 8 in MULTI..EXEC.
func TestFusedReadAheadSkippedWhileThePoolHoldsEnough(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for range 10 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var rec sent
	f.rdb.AddHook(rec.hook())
	cur, err := f.q.Claim(f.ctx, "w") // 8 read; 7 wait in the pool
	require.NoError(t, err)
	rec.take()
	skipped, readAhead := 0, 0
	for range 9 {
		out, err := f.q.completeAndClaim(f.ctx, cur, nil, "w")
		require.NoError(t, err)
		require.NotNil(t, out.next)
		cmds := rec.take()
		t.Logf("%v", cmds)
		require.Len(t, cmds, 16, "WATCH TIME MGET EXISTS, three index types or reads, the flags; MULTI, 2 SET, 4 index writes, EXEC")
		require.Equal(t, 2, count(cmds, "mget"), "the jobs, and the flags")
		require.Equal(t, 1, count(cmds, "exists"), "the jobs' only: no flag goes in one of its own")
		switch count(cmds, "zrangebyscore") {
		case 0:
			skipped++
			require.Equal(t, 3, count(cmds, "type"), "leased, succeeded and ready are typed")
		case 2:
			readAhead++
			require.Equal(t, []string{"type " + f.q.ks.index(0, idxSucceeded)}, slices.DeleteFunc(cmds, func(c string) bool { return !strings.HasPrefix(c, "type ") }),
				"ready and leased are typed by their read")
		default:
			t.Fatalf("read ahead of 1 shard: %v", cmds)
		}
		cur = out.next
	}
	t.Logf("%d fused calls skipped the read ahead, %d read ahead", skipped, readAhead)
	require.NotZero(t, skipped)
	require.NotZero(t, readAhead, "the pool ran low")
}

// A complete-and-claim transaction refuses an index of the wrong type that it would
// write, with a *WrongTypeError naming it, and writes nothing, whether a
// TYPE checks it or the read ahead's ZRANGEBYSCORE does in its stead.
func TestFusedTransactionRefusesAWrongTypedIndexWithOrWithoutReadAhead(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"read ahead", "pool holds enough"} {
		for _, idx := range []string{idxLeased, idxReady, idxSucceeded} {
			t.Run(mode+"/"+idx, func(t *testing.T) {
				t.Parallel()
				// The pool holds enough only while its read is younger than
				// readahead.Fresh/2. A loaded machine can take longer than
				// that from the claim to the decision; such an attempt shows
				// nothing about the mode, and the arrangement is made again.
				for attempt := 1; ; attempt++ {
					took := refuseWrongTypedIndex(t, mode, idx)
					if mode == "read ahead" || took <= readahead.Fresh/2 {
						return
					}
					require.Less(t, attempt, 20, "every attempt took longer than the pool's read stays fresh")
					t.Logf("attempt %d took %v, longer than the pool stays fresh: again", attempt, took)
				}
			})
		}
	}
}

// refuseWrongTypedIndex makes a complete-and-claim transaction meet an
// index of the wrong type, with the pool holding too few candidates (mode
// "read ahead") or enough, and checks that it refuses before MULTI and
// writes nothing. It returns how long passed from the claim that filled
// the pool to the refusal: in mode "pool holds enough", the pool was
// fresh, and nothing may have read ahead, only if that is at most
// readahead.Fresh/2.
func refuseWrongTypedIndex(t *testing.T, mode, idx string) time.Duration {
	t.Helper()
	f := setup(t, &Config{Logger: quietLog()})
	n := 2 // the pool holds 1 after the claim: too few, it reads ahead
	if mode == "pool holds enough" {
		n = 10
	}
	var ids []string
	for range n {
		j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	start := time.Now()
	cur, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	key := f.q.ks.index(0, idx)
	require.NoError(t, f.rdb.Set(f.ctx, key, "not a zset", 0).Err())
	var rec sent
	f.rdb.AddHook(rec.hook())

	out, err := f.q.completeAndClaim(f.ctx, cur, []byte("r"), "w")
	took := time.Since(start)
	cmds := rec.take()
	t.Logf("%v", cmds)
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, key, wt.Key)
	require.Nil(t, out.next)
	require.Zero(t, count(cmds, "multi"), "refused before MULTI")
	switch {
	case mode == "read ahead":
		require.NotZero(t, count(cmds, "zrangebyscore"))
	case took <= readahead.Fresh/2:
		require.Zero(t, count(cmds, "zrangebyscore"), "the pool was fresh and held enough")
	}
	got, err := f.rdb.Get(f.ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "not a zset", got)
	for _, id := range ids {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		if j.ID == cur.ID {
			require.Equal(t, StateActive, j.State)
			require.Nil(t, j.Result)
		} else {
			require.Equal(t, StatePending, j.State, "nothing was claimed")
		}
	}
	return took
}

// A job of a higher priority that comes due while the pool holds enough
// lower ones is claimed within the pool's refresh bound, as when every
// complete-and-claim transaction read ahead. Announced (this process enqueued it), the
// pool holds back the lower ones at once, and the next transaction reads
// ahead: the pool's next candidate is the job. Unannounced (another
// process enqueued it, and its hint is not heard), a transaction that
// starts more than readahead.Fresh/2 after the pool's last read reads ahead;
// one more learns from the shard's flag that the queue uses priorities
// and reads their indexes; the next takes the job.
func TestFusedClaimTakesAHigherPriorityWithinTheRefreshBound(t *testing.T) {
	t.Parallel()
	for _, announced := range []bool{true, false} {
		t.Run(fmt.Sprintf("announced=%v", announced), func(t *testing.T) {
			t.Parallel()
			f := setup(t, nil)
			for range 100 {
				_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
				require.NoError(t, err)
			}
			// A fused call claims nothing when the pool's last read is
			// older than readahead.Fresh as it takes its candidates (a
			// loaded machine, between two calls): it then takes no job
			// below the higher one either, and the test goes on with a
			// spare.
			var spares []*Job
			for range 16 {
				s, err := f.q.Claim(f.ctx, "w")
				require.NoError(t, err)
				spares = append(spares, s)
			}
			var rec sent
			f.rdb.AddHook(rec.hook())
			cur, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			producer := f.q
			if !announced {
				producer = f.twin(t)
			}
			var hi *Job
			var enqueued time.Time
			since, late := 0, 0 // calls started after the enqueue; of them, more than readahead.Fresh/2 after it
			var last time.Time  // when the call before started
			for {
				start := time.Now()
				out, err := f.q.completeAndClaim(f.ctx, cur, nil, "w")
				require.NoError(t, err)
				readAhead := count(rec.take(), "zrangebyscore") > 0
				if out.next == nil && (hi == nil || !announced) {
					t.Logf("a call %v after the one before claimed nothing: the pool was stale", start.Sub(last))
					require.NotEmpty(t, spares, "every fused call claimed a job, or nothing while the pool was stale")
					cur, spares, last = spares[0], spares[1:], start
					continue
				}
				last = start
				if hi == nil {
					if readAhead { // the pool holds 30 fresh candidates of priority 0
						hi, err = producer.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Priority: MaxPriority})
						require.NoError(t, err)
						enqueued = time.Now()
					}
					cur = out.next
					continue
				}
				since++
				if start.Sub(enqueued) > readahead.Fresh/2 {
					late++
				}
				if announced {
					require.True(t, readAhead, "the hint makes the next transaction read ahead")
					if out.next == nil || out.next.ID != hi.ID {
						got := f.q.pool.Take(1, readahead.AnyShard)
						require.NotEmpty(t, got)
						require.Equal(t, hi.ID, got[0].ID, "the pool's next candidate")
					}
					return
				}
				if out.next.ID == hi.ID {
					t.Logf("claimed by call %d after the enqueue, %v after it", since, time.Since(enqueued))
					return
				}
				require.Less(t, late, 3, "the unannounced job is taken by the third call past readahead.Fresh/2")
				cur = out.next
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
