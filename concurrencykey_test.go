package jobkey

import (
	"context"
	"errors"
	"fmt"
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

// slotsOf reads the concurrency value of key in q's key shard, decoded.
func slotsOf(t *testing.T, f *fixture, key string) (slotValue, bool) {
	t.Helper()
	s, err := f.rdb.Get(f.ctx, f.q.ks.slotKey(f.q.ks.shardOf(key), key)).Result()
	if errors.Is(err, redis.Nil) {
		return slotValue{}, false
	}
	require.NoError(t, err)
	v, err := decodeSlots(s)
	require.NoError(t, err)
	return v, true
}

// A key's limit caps its active jobs; other keys and unkeyed jobs are not
// held back; a completion frees a slot and pulls a waiting job forward;
// a lease that ran out frees its slot with no sweeper; a holder whose slot
// went to another job meanwhile cannot renew its lease.
func TestConcurrencyKeyLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Minute})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "a", 2))
	base := f.clock.Now().Add(-time.Minute)
	var as []string
	for i := range 5 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "a", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
		require.Equal(t, "a", j.ConcurrencyKey)
		as = append(as, j.ID)
	}
	b1, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "b", RunAt: base.Add(10 * time.Millisecond)})
	require.NoError(t, err)
	b2, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "b", RunAt: base.Add(11 * time.Millisecond)})
	require.NoError(t, err)
	free, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{RunAt: base.Add(12 * time.Millisecond)})
	require.NoError(t, err)

	claimed := map[string]*Job{}
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		claimed[j.ID] = j
	}
	require.Len(t, claimed, 4, "two of key a (limit 2), one of key b (the default, 1), and the unkeyed job")
	require.Contains(t, claimed, as[0])
	require.Contains(t, claimed, as[1])
	require.Contains(t, claimed, b1.ID)
	require.Contains(t, claimed, free.ID)

	info, err := f.q.Concurrency(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, ConcurrencyInfo{Key: "a", Limit: 2, Own: true, Active: 2, Waiting: 3}, info)
	info, err = f.q.Concurrency(f.ctx, "b")
	require.NoError(t, err)
	require.Equal(t, ConcurrencyInfo{Key: "b", Limit: 1, Active: 1, Waiting: 1}, info)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "entries moved past RunAt while their key is full are no finding")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, st.Pending, "waiting jobs are pending")
	require.EqualValues(t, 0, st.Due, "none of them is due while its key is full")

	// A completion frees a slot and pulls the first waiting job forward:
	// due again at its RunAt, with a wake-up.
	_, err = f.q.Complete(f.ctx, claimed[as[0]], nil)
	require.NoError(t, err)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, as[2], j.ID, "the oldest waiting job of key a")
	claimed[j.ID] = j
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)

	// A lease that ran out frees its slot: no sweeper, the next claim just
	// does not count it. Extend the others first, so only as[1] lapses.
	f.clock.Advance(40 * time.Second)
	for _, id := range []string{as[2], b1.ID, free.ID} {
		claimed[id], err = f.q.Extend(f.ctx, claimed[id])
		require.NoError(t, err)
	}
	f.clock.Advance(30 * time.Second)
	// A claim that meets as[3] before the lapsed job (as one reading ahead
	// may) gives it as[1]'s slot.
	got, _, err := f.q.claimTxn(f.ctx, []candidate{{ID: as[3], Index: readyIndex(0)}}, []string{"w2"}, true, nil)
	require.NoError(t, err)
	require.NotNil(t, got[0], "the lapsed lease's slot is free")
	claimed[as[3]] = got[0]
	// The lapsed holder cannot renew: its slot is gone.
	_, err = f.q.Extend(f.ctx, claimed[as[1]])
	require.ErrorIs(t, err, ErrLeaseLost)
	// Its lease is due for a claim, which finds the key full: the job goes
	// back to pending and waits, without running.
	_, err = f.q.Claim(f.ctx, "w3")
	require.ErrorIs(t, err, ErrNoJob)
	back, err := f.q.Get(f.ctx, as[1])
	require.NoError(t, err)
	require.Equal(t, StatePending, back.State)
	require.Contains(t, back.LastError, "waiting for a slot")
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)

	// Finish everything: each completion pulls the next waiting job forward.
	for id, j := range claimed {
		if id != as[0] && id != as[1] {
			_, err := f.q.Complete(f.ctx, j, nil)
			require.NoError(t, err)
		}
	}
	for {
		j, err := f.q.Claim(f.ctx, "w4")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, j, nil)
		require.NoError(t, err)
	}
	for _, id := range append(as, b1.ID, b2.ID) {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, j.State, id)
	}
	v, ok := slotsOf(t, f, "a")
	require.True(t, ok, "key a keeps its own limit")
	require.Equal(t, slotValue{limit: 2, leases: []slotLease{}, waiting: []slotWait{}}, v)
	_, ok = slotsOf(t, f, "b")
	require.False(t, ok, "key b has nothing left to keep")
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// Fail, Release, and a claim that fails a job whose last lease ran out,
// each give the slot back in the same EXEC.
func TestConcurrencySlotGivenBack(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	enq := func() *Job {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", MaxAttempts: 1})
		require.NoError(t, err)
		return j
	}
	claim := func() *Job {
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		return j
	}
	active := func() int {
		info, err := f.q.Concurrency(f.ctx, "k")
		require.NoError(t, err)
		return info.Active
	}
	enq()
	j := claim()
	require.Equal(t, 1, active())
	_, err := f.q.Release(f.ctx, j)
	require.NoError(t, err)
	require.Equal(t, 0, active(), "Release")
	j = claim()
	_, err = f.q.Fail(f.ctx, j, errors.New("boom"))
	require.NoError(t, err)
	require.Equal(t, 0, active(), "Fail")
	enq()
	claim()
	f.clock.Advance(2 * time.Minute)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "its only attempt's lease ran out: it fails")
	_, ok := slotsOf(t, f, "k")
	require.False(t, ok, "the claim that failed it removed its lease")
}

// Enqueue refuses bad keys; on a queue of several shards a keyed job lives
// in its key's shard, Get finds it, and a caller's ID elsewhere is refused
// until IDFor places it.
func TestConcurrencyKeyPlacement(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 8})
	for _, bad := range []string{strings.Repeat("k", MaxConcurrencyKeyLen+1), "a{b}"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: bad})
		require.ErrorIs(t, err, ErrInvalid)
	}
	want := f.q.ks.shardOf("cust")
	for range 20 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "cust"})
		require.NoError(t, err)
		require.Equal(t, want, f.q.ks.shardOf(j.ID))
		got, err := f.q.Get(f.ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, "cust", got.ConcurrencyKey)
	}
	base := "order-1"
	for f.q.ks.shardOf(base) == want {
		base += "x"
	}
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: base, ConcurrencyKey: "cust"})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "IDFor")
	id, err := f.q.IDFor("cust", base)
	require.NoError(t, err)
	again, err := f.q.IDFor("cust", base)
	require.NoError(t, err)
	require.Equal(t, id, again, "the same ID every time")
	require.True(t, strings.HasPrefix(id, base+"~"))
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: "cust"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: "cust"})
	require.ErrorIs(t, err, ErrJobExists, "IDFor deduplicates as the base ID would")

	// Every job of the key, claimed one by one (limit 1), never two at once.
	var cur *Job
	for n := 0; n < 21; n++ {
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		require.Equal(t, "cust", j.ConcurrencyKey)
		_, err = f.q.Claim(f.ctx, "w")
		require.ErrorIs(t, err, ErrNoJob, "limit 1")
		cur = j
		_, err = f.q.Complete(f.ctx, cur, nil)
		require.NoError(t, err)
	}
}

// The acceptance test of concurrency keys: 200 jobs of one key with limit 2,
// run by 16 handler slots over two Work processes on a real Redis, beside
// jobs of other keys. At most 2 of the key's handlers overlap (and 2 do),
// every job finishes, and the other keys' jobs are not held back behind it.
func TestConcurrencyLimitUnderWork(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: 2 * time.Second})
	f.q.clock.Fake = nil // real time: Work runs on it
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "hot", 2))
	const hot, others = 200, 60
	var ids []string
	for i := range hot {
		j, err := f.q.Enqueue(f.ctx, "hot", nil, &EnqueueOpts{ConcurrencyKey: "hot", Priority: i % 2})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	for i := range others {
		opts := &EnqueueOpts{}
		if i%2 == 0 {
			opts.ConcurrencyKey = fmt.Sprintf("cold-%d", i)
		}
		j, err := f.q.Enqueue(f.ctx, "cold", nil, opts)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	var running, peak, hotDone, coldDone atomic.Int64
	var coldFinishedAt atomic.Int64 // how many hot jobs had finished when the last cold one did
	log := newLeaseLog()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		defer log.begin(j)()
		if j.Type == "cold" {
			time.Sleep(2 * time.Millisecond)
			if coldDone.Add(1) == others {
				coldFinishedAt.Store(hotDone.Load())
			}
			return nil, nil
		}
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(3 * time.Millisecond)
		running.Add(-1)
		hotDone.Add(1)
		return nil, nil
	})
	ctx, cancel := context.WithTimeout(f.ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			_ = f.q.Work(ctx, h, &WorkOpts{Concurrency: 8, Name: fmt.Sprintf("p%d", w), PollInterval: 50 * time.Millisecond,
				OnRecorded: log.onRecorded})
		})
	}
	waitSucceeded(t, ctx, f.q, hot+others)
	cancel()
	wg.Wait()
	require.EqualValues(t, 2, peak.Load(), "at most 2 of the key's handlers at once, and the slots were used")
	require.Less(t, coldFinishedAt.Load(), int64(hot/2), "the other keys' jobs all ran before half the hot key's had")
	// A job may run again when its run's outcome could not be recorded
	// before its lease ran out (see leaseLog): never two runs at once, and
	// each job finished once.
	if n := log.check(t, f.ctx, f.q, ids); n > 0 {
		t.Logf("%d reruns after a lost outcome", n)
	}
	info, err := f.q.Concurrency(f.ctx, "hot")
	require.NoError(t, err)
	require.Equal(t, 0, info.Active)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// The value of a key that cannot be read is kept as it is: its jobs wait,
// a running job of it still finishes, and nothing overwrites it.
func TestConcurrencyValueUnreadable(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Logger: quietLog()})
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	key := f.q.ks.slotKey(0, "k")
	require.NoError(t, f.rdb.Set(f.ctx, key, "\xc1garbage", 0).Err())
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "its key cannot be counted: the job waits")
	_, err = f.q.Extend(f.ctx, c)
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err, "a running job still finishes")
	raw, err := f.rdb.Get(f.ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "\xc1garbage", raw, "kept as it was")
	_, err = f.q.Concurrency(f.ctx, "k")
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, f.q.SetConcurrencyLimit(f.ctx, "k", 3), ErrCorrupt)

	// Deleted by the operator, it starts again empty and the job runs.
	require.NoError(t, f.rdb.Del(f.ctx, key).Err())
	f.clock.Advance(2 * unreadableWait)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
}

func TestSlotCodec(t *testing.T) {
	t.Parallel()
	v := slotValue{limit: 3, leases: []slotLease{{"a", 1, 100}, {"ü", 1<<64 - 1, -1}},
		waiting: []slotWait{{"w", 9, 5, 0}, {"x", 0, 6, 7}}}
	got, err := decodeSlots(string(v.encode()))
	require.NoError(t, err)
	require.Equal(t, v, got)
	require.Nil(t, (&slotValue{leases: []slotLease{}}).encode(), "nothing to keep")
	for name, in := range map[string]string{
		"empty": "", "notArray": "\xa1x", "short": "\x93\x01\x00\x90", "trailing": string(v.encode()) + "\x00",
		"lease": "\x94\x01\x00\x91\x92\xa1a\x01\x90", "prio": "\x94\x01\x00\x90\x91\x94\xa1a\x0a\x00\x00",
		"limit": "\x94\x01\xcd\xff\xff\x90\x90", "hostile": "\x94\x01\x00\xdd\xff\xff\xff\xff",
	} {
		_, err := decodeSlots(in)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
	_, err = decodeSlots("\x94\x03\x00\x90\x90")
	require.ErrorIs(t, err, ErrUnsupportedFormat)
}

func FuzzSlotCodec(f *testing.F) {
	f.Add(string((&slotValue{limit: 3, leases: []slotLease{{"a", 1, 100}}, waiting: []slotWait{{"w", 9, 5, 0}}}).encode()))
	f.Add("\x94\x01\x00\xdd\xff\xff\xff\xff")
	f.Add(string((&slotValue{limit: 3, rate: 4, period: 1000, starts: []int64{10, 20}}).encode()))
	f.Add("\x96\x02\x00\x90\x90\x92\x01\x01\x92\x01\x02")
	f.Fuzz(func(t *testing.T, s string) {
		v, err := decodeSlots(s)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupportedFormat) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		b := v.encode()
		if b == nil {
			return
		}
		again, err := decodeSlots(string(b))
		require.NoError(t, err)
		require.Equal(t, v, again)
	})
}

// Update cannot change a job's ConcurrencyKey, which is set at enqueue and
// never changes. A running job moved to another key would hold no slot of
// it, so that key would run one job more than its limit (here 2 under limit
// 1); a job moved off its key would keep its slot until its lease ran out;
// and a key of another shard, or one no key name may be, would break the
// placement that lets one transaction change a job and its key's value.
func TestConcurrencyKeyFixedByUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	a, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	freeID, err := f.q.IDFor("k2", "free")
	require.NoError(t, err)
	free, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: freeID})
	require.NoError(t, err)
	b, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k2"})
	require.NoError(t, err)
	for _, c := range []struct {
		id  string
		key string
	}{{a.ID, "k2"}, {a.ID, ""}, {free.ID, "k2"}, {b.ID, "a{b}"}} {
		_, err := f.q.Update(f.ctx, c.id, func(j *Job) error { j.ConcurrencyKey = c.key; return nil })
		require.ErrorIs(t, err, ErrInvalid, "job %s to key %q", c.id, c.key)
	}
	claimed := map[string]bool{}
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		claimed[j.ID] = true
		_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.ConcurrencyKey = "k2"; return nil })
		if j.ConcurrencyKey != "k2" {
			require.ErrorIs(t, err, ErrInvalid, "a running job moved to key k2")
		}
	}
	require.Len(t, claimed, 3)
	info, err := f.q.Concurrency(f.ctx, "k2")
	require.NoError(t, err)
	require.Equal(t, 1, info.Active, "key k2 (limit 1) runs one job")
	for _, id := range []string{a.ID, free.ID, b.ID} {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, map[string]string{a.ID: "k", free.ID: "", b.ID: "k2"}[id], j.ConcurrencyKey)
	}
}

// CancelPending walks pending jobs newest first; a claim that finds a
// keyed job's key full moves its entry above the walk. The walk looks
// again above its start for such jobs: every job pending when it started
// is canceled.
func TestCancelPendingFindsParkedJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	holder, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	w, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	f.clock.Advance(time.Millisecond)
	specs := make([]JobSpec, MaxListLimit)
	for i := range specs {
		specs[i] = JobSpec{Type: "t"}
	}
	_, err = f.q.EnqueueMany(f.ctx, specs)
	require.NoError(t, err)
	var once sync.Once
	f.q.afterBulkPage = func() {
		once.Do(func() {
			// A claim meets w now, behind the walk, and finds k full.
			got, _, err := f.q.claimTxn(f.ctx, []candidate{{ID: w.ID, Index: readyIndex(0)}}, []string{"w2"}, true, nil)
			require.NoError(t, err)
			require.Nil(t, got[0])
		})
	}
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	require.Equal(t, MaxListLimit+1, res.Done)
	j, err := f.q.Get(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, j.State, "the job its key held back was pending when the walk started")
	_, err = f.q.Complete(f.ctx, holder, nil)
	require.NoError(t, err)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// A job waiting for a slot that is canceled and retried, whose RunAt an
// Update moves, or that is deleted and enqueued again under its ID, is due
// at its new RunAt: a slot that frees later does not pull its entry back
// to the RunAt it waited with (found by TestModel: the entry came due
// before RunAt, and Verify reported it).
func TestConcurrencyWaitingJobRewritten(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	enq := func(id string, runAt time.Time) *Job {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: "k", RunAt: runAt})
		require.NoError(t, err)
		return j
	}
	now := f.clock.Now()
	a, b, c, d := enq("a", now.Add(-4*time.Millisecond)), enq("b", now.Add(-3*time.Millisecond)),
		enq("c", now.Add(-2*time.Millisecond)), enq("d", now.Add(-time.Millisecond))
	held, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, a.ID, held.ID)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "b, c and d wait for a's slot")
	info, err := f.q.Concurrency(f.ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 3, info.Waiting)

	f.clock.Advance(10 * time.Second)
	_, err = f.q.Cancel(f.ctx, b.ID)
	require.NoError(t, err)
	_, err = f.q.Retry(f.ctx, b.ID)
	require.NoError(t, err)
	later := f.clock.Now().Add(time.Hour)
	_, err = f.q.Update(f.ctx, c.ID, func(j *Job) error { j.RunAt = later; return nil })
	require.NoError(t, err)
	require.NoError(t, f.q.Delete(f.ctx, d.ID))
	d = enq(d.ID, later)

	// A higher limit frees slots, and pulls waiting jobs forward.
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 4))
	for _, j := range []*Job{b, c, d} {
		f.requireIndexed(t, j)
	}
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, b.ID, j.ID)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "c and d are due in an hour")
	info, err = f.q.Concurrency(f.ctx, "k")
	require.NoError(t, err)
	require.Zero(t, info.Waiting, "none of them waits as it was listed")
}

// ckKeys returns the concurrency values stored under prefix.
func ckKeys(t *testing.T, rdb *redis.Client, prefix string) []string {
	t.Helper()
	var out []string
	it := rdb.Scan(context.Background(), 0, prefix+":{*}:ck:*", 1000).Iterator()
	for it.Next(context.Background()) {
		out = append(out, it.Val())
	}
	require.NoError(t, it.Err())
	return out
}

// A keyed job canceled while it runs keeps its lease in its key's value
// until the lease would have ended, and nothing writes that value again.
// Once every lease in it has ended, a value with no limit of its own goes
// by itself, with no sweeper (after DeleteFinished and Trim left it
// behind); a key with a limit set by SetConcurrencyLimit keeps its value
// and its limit.
func TestConcurrencyValueOfCanceledRunGoesWhenItsLeaseEnds(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, prefix, Config{Lease: time.Second, Logger: quietLog()})
	require.NoError(t, q.SetConcurrencyLimit(ctx, "limited", 3))
	keys := []string{"k0", "k1", "k2", "k3", "k4", "limited"}
	for _, k := range keys {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: k})
		require.NoError(t, err)
	}
	for range keys {
		j, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		_, err = q.Cancel(ctx, j.ID)
		require.NoError(t, err, "canceled while it runs")
	}
	for _, k := range keys {
		info, err := q.Concurrency(ctx, k)
		require.NoError(t, err)
		require.Equal(t, 1, info.Active, "key %s: the canceled run's lease still counts", k)
	}
	require.Len(t, ckKeys(t, rdb, prefix), len(keys), "the leases have not ended yet")
	// Delete waits for a canceled run's lease to end.
	require.Eventually(t, func() bool {
		res, err := q.DeleteFinished(ctx, StateCanceled, "")
		require.NoError(t, err)
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return res.Unreadable == 0 && st.Canceled == 0
	}, 10*time.Second, 50*time.Millisecond)
	_, err := q.Trim(ctx)
	require.NoError(t, err)

	limited := q.ks.slotKey(q.ks.shardOf("limited"), "limited")
	left := ckKeys(t, rdb, prefix)
	for deadline := time.Now().Add(10 * time.Second); len(left) > 1 && time.Now().Before(deadline); left = ckKeys(t, rdb, prefix) {
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, []string{limited}, left, "only the key with a limit of its own keeps its value")
	info, err := q.Concurrency(ctx, "limited")
	require.NoError(t, err)
	require.Equal(t, ConcurrencyInfo{Key: "limited", Limit: 3, Own: true}, info)
	ttl, err := rdb.PTTL(ctx, limited).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a stored limit does not expire")
}

// A freed slot pulls a waiting job's entry forward no earlier than the job's
// own RunAt. A waiting job's listing keeps the RunAt it had when it was
// listed; a job whose RunAt an Update moved later since stays due at its new
// RunAt, and Verify finds no entry that says due for a job that is not.
func TestFreedSlotKeepsUpdatedWaiterAtItsRunAt(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	ca, b := claimWithWaiterBehind(t, f)
	later := f.clock.Now().Add(time.Hour)
	_, err := f.q.Update(f.ctx, b.ID, func(j *Job) error { j.RunAt = later; return nil })
	require.NoError(t, err)
	verifyClean(t, f, "b is pending, due in an hour")
	_, err = f.q.Complete(f.ctx, ca, nil)
	require.NoError(t, err)
	verifyClean(t, f, "b is still due in an hour: its entry must not say due now")
}

// The same with Cancel and Retry: a waiting job canceled stays listed, and
// once it is retried later, the next freed slot leaves its entry at its new
// RunAt, not at the one it had before.
func TestFreedSlotKeepsRetriedWaiterAtItsRunAt(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	ca, b := claimWithWaiterBehind(t, f)
	_, err := f.q.Cancel(f.ctx, b.ID)
	require.NoError(t, err)
	f.clock.Advance(10 * time.Second)
	_, err = f.q.Retry(f.ctx, b.ID)
	require.NoError(t, err)
	_, err = f.q.Extend(f.ctx, ca) // a keeps the slot
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, ca, nil)
	require.NoError(t, err)
	verifyClean(t, f, "b's entry is at its RunAt, not before")
}

// A waiting job pulled forward into a freed slot holds it in mind for a
// while, so that one freed slot does not pull every waiting job forward.
// When that job is canceled (or deleted) before it is claimed, the next
// waiting job is pulled forward: the key has room, and nothing else brings
// its entry due before the lease it waited for would have ended.
func TestCanceledPulledJobLeavesSlotToNextWaiter(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cancel", "delete"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Hour, ClaimWindow: 1})
			var ids []string
			for i := range 3 {
				j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: f.clock.Now().Add(time.Duration(i) * time.Millisecond)})
				require.NoError(t, err)
				ids = append(ids, j.ID)
			}
			f.clock.Advance(time.Second)
			a, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			require.Equal(t, ids[0], a.ID)
			for range 2 {
				_, err = f.q.Claim(f.ctx, "w")
				require.ErrorIs(t, err, ErrNoJob, "b and c wait for a's slot")
			}
			_, err = f.q.Complete(f.ctx, a, nil) // pulls b forward
			require.NoError(t, err)
			if how == "cancel" {
				_, err = f.q.Cancel(f.ctx, ids[1])
			} else {
				err = f.q.Delete(f.ctx, ids[1])
			}
			require.NoError(t, err)
			c, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err, "the key has room and c waits for it, not for the hour a's lease would have lasted")
			require.Equal(t, ids[2], c.ID)
			verifyClean(t, f, "")
		})
	}
}

// A run canceled while it ran keeps its slot until its lease would have
// ended (its handler may still be stopping), and a job enqueued again under
// the same ID does not take that slot: a claim counts every live lease, the
// claimed ID's own old run's included, and keeps that lease in the key's
// value. jobkey keeps the ID taken meanwhile (Delete waits, and the key
// outlives its retention: lastrun.go), so here the value goes outside
// jobkey, as a DEL by hand or an eviction would take it.
func TestReenqueuedIDCountsCanceledRunSlot(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
			require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", limit))
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: "k"})
			require.NoError(t, err)
			for i := 1; i < limit; i++ { // the other slots are busy
				_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: f.clock.Now().Add(time.Duration(i) * time.Millisecond)})
				require.NoError(t, err)
			}
			f.clock.Advance(time.Second)
			for i := range limit {
				j, err := f.q.Claim(f.ctx, "w")
				require.NoError(t, err)
				if i == 0 {
					require.Equal(t, "x", j.ID)
				}
			}
			_, err = f.q.Cancel(f.ctx, "x") // its handler may run until its lease ends
			require.NoError(t, err)
			_, err = f.q.Retry(f.ctx, "x") // due when that run's lease ends
			require.NoError(t, err)
			require.ErrorIs(t, f.q.Delete(f.ctx, "x"), ErrState, "the canceled run's lease holds")
			require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys("x").Job).Err())
			require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys("x").Ready, "x").Err())
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: "k"})
			require.NoError(t, err)
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
			require.NoError(t, err)
			_, err = f.q.Claim(f.ctx, "w")
			require.ErrorIs(t, err, ErrNoJob, "the key's %d slots are held, one by the canceled run of x", limit)
			info, err := f.q.Concurrency(f.ctx, "k")
			require.NoError(t, err)
			require.Equal(t, limit, info.Active)
		})
	}
}

// leaseLog records each handler call of a Work test and each outcome Work
// recorded, so that a test judges runs by their leases and finishes, not by
// counting handler calls. Work runs a job at least once: a run whose
// outcome could not be recorded before its lease ran out (its completion's
// reply lost, or Redis too slow under load) stops itself at its
// self-fence, and the job is claimed again once that lease has ended in
// Redis. That rerun is allowed; two runs of one job at once, a job
// finished twice, or a rerun that no lost outcome explains are not.
type leaseLog struct {
	mu    sync.Mutex
	runs  map[string][]runRec
	done  map[string][]uint64         // per job, the lease tokens of the successes recorded
	unrec map[string]map[uint64]error // per job and lease token: why the outcome was not recorded
}

// runRec is one handler call.
type runRec struct {
	token      uint64
	attempt    int
	claimed    time.Time // Redis's clock: when the claim was written
	leaseUntil time.Time // Redis's clock: the claim's lease end
	start, end time.Time // this process's clock
}

func newLeaseLog() *leaseLog {
	return &leaseLog{runs: map[string][]runRec{}, done: map[string][]uint64{}, unrec: map[string]map[uint64]error{}}
}

// begin records a handler call of j starting; the func it returns records
// the call returning.
func (l *leaseLog) begin(j *Job) (end func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[j.ID] = append(l.runs[j.ID], runRec{token: j.LeaseToken, attempt: j.Attempt, claimed: j.UpdatedAt,
		leaseUntil: j.LeaseUntil, start: time.Now()})
	i := len(l.runs[j.ID]) - 1
	return func() {
		l.mu.Lock()
		l.runs[j.ID][i].end = time.Now()
		l.mu.Unlock()
	}
}

// waitSucceeded waits until n jobs of q have succeeded, by Stats: a
// completion whose reply was lost landed, yet Work reported it as not
// recorded, so successes reported to OnRecorded may fall short.
func waitSucceeded(t *testing.T, ctx context.Context, q *Queue, n int) {
	t.Helper()
	for {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		if st.Succeeded >= int64(n) {
			return
		}
		require.NoError(t, ctx.Err(), "%d of %d jobs succeeded", st.Succeeded, n)
		time.Sleep(20 * time.Millisecond)
	}
}

// onRecorded is a WorkOpts.OnRecorded.
func (l *leaseLog) onRecorded(j *Job, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		if l.unrec[j.ID] == nil {
			l.unrec[j.ID] = map[uint64]error{}
		}
		l.unrec[j.ID][j.LeaseToken] = err
	case j.State == StateSucceeded:
		l.done[j.ID] = append(l.done[j.ID], j.LeaseToken)
	}
}

// check holds every job of ids to: one success, stored under the lease
// token of its last run (and reported to OnRecorded at most once, and only
// for that run: a completion whose reply was lost may have landed
// unreported); runs that never overlap; and each
// rerun explained, by a run before it whose outcome was not recorded, and
// claimed under a new token, for a later attempt, no sooner than that run's
// lease ended. It returns how many reruns it found.
func (l *leaseLog) check(t *testing.T, ctx context.Context, q *Queue, ids []string) (reruns int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Len(t, l.runs, len(ids), "every job ran, and no other")
	for _, id := range ids {
		runs := l.runs[id]
		require.NotEmpty(t, runs, "job %s ran", id)
		require.LessOrEqual(t, len(l.done[id]), 1, "job %s: at most one success recorded", id)
		for i := 1; i < len(runs); i++ {
			prev, next := runs[i-1], runs[i]
			t.Logf("job %s ran again: run %d token %d attempt %d claimed %s lease to %s, ran %s..%s, outcome not recorded: %v; "+
				"run %d token %d attempt %d claimed %s (%v after that lease's first end), started %v after the earlier run returned",
				id, i-1, prev.token, prev.attempt, prev.claimed.Format("15:04:05.000"), prev.leaseUntil.Format("15:04:05.000"),
				prev.start.Format("15:04:05.000"), prev.end.Format("15:04:05.000"), l.unrec[id][prev.token],
				i, next.token, next.attempt, next.claimed.Format("15:04:05.000"), next.claimed.Sub(prev.leaseUntil), next.start.Sub(prev.end))
			require.False(t, prev.end.IsZero(), "job %s: run %d never returned, yet the job ran again", id, i-1)
			require.True(t, prev.end.Before(next.start), "job %s: runs %d and %d overlap", id, i-1, i)
			require.NotEqual(t, prev.token, next.token, "job %s: run %d is a new claim", id, i)
			require.Greater(t, next.attempt, prev.attempt, "job %s: run %d is a later attempt", id, i)
			require.False(t, next.claimed.Before(prev.leaseUntil), "job %s: run %d was claimed before run %d's lease ended", id, i, i-1)
			require.Error(t, l.unrec[id][prev.token], "job %s: run %d ran again though its outcome was recorded", id, i-1)
			reruns++
		}
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, j.State, id)
		require.Equal(t, runs[len(runs)-1].token, j.LeaseToken, "job %s: finished by its last run", id)
		if len(l.done[id]) == 1 {
			require.Equal(t, j.LeaseToken, l.done[id][0], "job %s: the success recorded is the one stored", id)
		}
	}
	return reruns
}

// claimWithWaiterBehind enqueues jobs a and b on concurrency key "k" (b due
// a millisecond after a), claims a as ca, and requires b to wait for a's
// slot.
func claimWithWaiterBehind(t *testing.T, f *fixture) (ca, b *Job) {
	t.Helper()
	a, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	b, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: a.RunAt.Add(time.Millisecond)})
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	ca, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, a.ID, ca.ID)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "b waits for a's slot")
	return ca, b
}

// A key's jobs start in their order. Here one key (limit 2) has a backlog
// of 300 jobs on a queue of 8 shards, and 100 newer jobs of the key come
// due while it drains: a job is overtaken (a job of the key with a later
// RunAt starts before it, while it was due) only by the few jobs already
// pulled forward or met by claims in flight when it was due, never by
// jobs that came due after it was listed. Before, a freed slot went to whichever claim came first,
// most often a newer job that had just come due, and the oldest waited
// until its parked entry came due.
func TestConcurrencyKeyStartsItsJobsInOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: 5 * time.Second, Shards: 8})
	f.q.clock.Fake = nil // real time: Work runs on it
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "cust", 2))
	const backlog, fresh = 300, 100
	runAt := map[string]time.Time{}
	var mu sync.Mutex
	base := time.Now().Add(-time.Minute)
	for i := range backlog {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "cust", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
		runAt[j.ID] = j.RunAt
	}
	var order []string
	claimed := map[string]time.Time{}
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		order, claimed[j.ID] = append(order, j.ID), j.StartedAt
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return nil, nil
	})
	ctx, cancel := context.WithTimeout(f.ctx, 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 2 {
		q := f.q
		if w > 0 {
			q = f.otherProcess(t, f.q.cfg)
		}
		wg.Go(func() {
			_ = q.Work(ctx, h, &WorkOpts{Concurrency: 4, Name: fmt.Sprintf("p%d", w), PollInterval: 20 * time.Millisecond})
		})
	}
	// Newer jobs of the key come due while the backlog drains.
	for range fresh {
		time.Sleep(5 * time.Millisecond)
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "cust"})
		require.NoError(t, err)
		mu.Lock()
		runAt[j.ID] = j.RunAt
		mu.Unlock()
	}
	waitSucceeded(t, ctx, f.q, backlog+fresh)
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, order, backlog+fresh)
	// The jobs in the order they were claimed (StartedAt, Redis's clock,
	// to the millisecond), and within a millisecond in the order their
	// handlers began: a handler may begin after one claimed later, on a
	// loaded machine by many milliseconds, which is no overtake by a
	// claim (CI's full run once counted 11 that way).
	for id, at := range claimed {
		require.False(t, at.IsZero(), "job %s ran with no StartedAt", id)
	}
	slices.SortStableFunc(order, func(a, b string) int { return claimed[a].Compare(claimed[b]) })
	// For each job, how many jobs with a later RunAt started before it.
	most, total := 0, 0
	for i, id := range order {
		n := 0
		for _, before := range order[:i] {
			if runAt[before].After(runAt[id]) {
				n++
			}
		}
		most, total = max(most, n), total+n
	}
	t.Logf("%d jobs of one key over 8 shards: overtaken by at most %d newer jobs, %d overtakes in all", len(order), most, total)
	// A job listed as waiting is overtaken only by jobs pulled forward
	// before it was listed (at most the key's limit), and by newer jobs
	// that claims in flight met before any claim met it: at most one per
	// runner. Before, freed slots went to newer jobs by the hundred.
	const limit, runners = 2, 8
	require.LessOrEqual(t, most, limit+runners, "a job is overtaken by at most its key's limit and the claims in flight")
}
