package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// claimAll claims until none is claimable, and returns the IDs claimed.
func claimAll(t *testing.T, f *fixture) []string {
	t.Helper()
	var ids []string
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return ids
		}
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
}

// A key's rate limit lets at most n of its jobs start within any period,
// by Redis's clock; a job over it waits pending, its entry due when the
// rate lets it start, and holds back neither runners nor other keys.
func TestRateLimitStartsAtMostNPerPeriod(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Minute})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "api", 100))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "api", 3, 10*time.Second))
	base := f.clock.Now().Add(-time.Minute)
	var api []string
	for i := range 7 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "api", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
		api = append(api, j.ID)
	}
	other, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "other", RunAt: base.Add(time.Second)})
	require.NoError(t, err)
	free, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{RunAt: base.Add(2 * time.Second)})
	require.NoError(t, err)

	got := claimAll(t, f)
	require.ElementsMatch(t, append(slices.Clone(api[:3]), other.ID, free.ID), got,
		"the first three of the key start, the rest wait; the other key's job and the unkeyed one are not held back")
	info, err := f.q.Concurrency(f.ctx, "api")
	require.NoError(t, err)
	require.Equal(t, ConcurrencyInfo{Key: "api", Limit: 100, Own: true, Active: 3, Rate: 3, RatePeriod: 10 * time.Second, Started: 3}, info,
		"a job held back by the rate alone is not listed as waiting for a slot")
	start := f.clock.Now()
	for _, id := range api[3:] {
		_, score := f.indexOf(t, id)
		require.Equal(t, toMillis(start.Add(10*time.Second)), score, "due when the first start leaves the window")
	}

	// Completing frees slots, not the rate.
	for _, id := range api[:3] {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, j, nil)
		require.NoError(t, err)
	}
	f.clock.Advance(10*time.Second - time.Millisecond)
	require.Empty(t, claimAll(t, f), "1 ms before the window ends nothing starts")
	f.clock.Advance(time.Millisecond)
	require.Equal(t, api[3:6], claimAll(t, f), "three more start, oldest first")
	info, err = f.q.Concurrency(f.ctx, "api")
	require.NoError(t, err)
	require.Equal(t, 3, info.Started)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// The rate is judged over a sliding window, not fixed ones: starts spread
// over a period leave it one at a time.
func TestRateLimitWindowSlides(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Minute})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 100))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 2, time.Second))
	base := f.clock.Now().Add(-time.Minute)
	for i := range 6 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
	}
	require.Len(t, claimAll(t, f), 2, "t=0: two starts")
	f.clock.Advance(600 * time.Millisecond)
	require.Empty(t, claimAll(t, f), "t=600ms: both starts are within the last second")
	f.clock.Advance(400 * time.Millisecond)
	require.Len(t, claimAll(t, f), 2, "t=1s: both left the window")
	f.clock.Advance(999 * time.Millisecond)
	require.Empty(t, claimAll(t, f), "t=1.999s: a fixed window would have opened at 2s-0, a sliding one not yet")
	f.clock.Advance(time.Millisecond)
	require.Len(t, claimAll(t, f), 2)
}

// A key over its concurrency limit and its rate waits for both; a freed
// slot pulls a waiting job forward to when the rate lets it start, not
// before.
func TestRateLimitComposesWithConcurrencyLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Minute})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 1))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 1, 30*time.Second))
	base := f.clock.Now().Add(-time.Minute)
	var ids []string
	for i := range 3 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	require.Equal(t, ids[:1], claimAll(t, f))
	start := f.clock.Now()
	for _, id := range ids[1:] {
		_, score := f.indexOf(t, id)
		require.Equal(t, toMillis(start.Add(time.Minute)), score, "due when the slot may free (the lease), later than the rate")
	}
	f.clock.Advance(time.Second)
	j, err := f.q.Get(f.ctx, ids[0])
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, j, nil)
	require.NoError(t, err)
	_, score := f.indexOf(t, ids[1])
	require.Equal(t, toMillis(start.Add(30*time.Second)), score, "the freed slot pulls the first waiter to when the rate lets it start")
	require.Empty(t, claimAll(t, f))
	f.clock.Advance(29 * time.Second)
	require.Equal(t, ids[1:2], claimAll(t, f))
}

// SetRateLimit refuses what it cannot keep, stores the rate in the key's
// value (format 2 only once a rate is set), and 0 takes it away again.
func TestSetRateLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, c := range []struct {
		key    string
		n      int
		period time.Duration
	}{{"", 1, time.Second}, {"k", -1, time.Second}, {"k", MaxRateLimit + 1, time.Second}, {"k", 1, 0},
		{"k", 1, time.Microsecond}, {"k", 1, 1500 * time.Microsecond}, {"k", 1, MaxRatePeriod + time.Millisecond}} {
		require.ErrorIs(t, f.q.SetRateLimit(f.ctx, c.key, c.n, c.period), ErrInvalid, "%+v", c)
	}
	_, ok := slotsOf(t, f, "k")
	require.False(t, ok, "nothing written")

	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 2))
	raw, err := f.rdb.Get(f.ctx, f.q.ks.slotKey(f.q.ks.shardOf("k"), "k")).Bytes()
	require.NoError(t, err)
	require.Equal(t, byte(slotFormat), raw[1], "a key with no rate keeps format 1, which older builds read")
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 5, time.Minute))
	v, ok := slotsOf(t, f, "k")
	require.True(t, ok)
	require.Equal(t, 2, v.limit)
	require.Equal(t, 5, v.rate)
	require.EqualValues(t, 60000, v.period)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.slotKey(f.q.ks.shardOf("k"), "k")).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a rate of its own keeps the value")

	require.NoError(t, f.q.SetRateLimit(f.ctx, "r", 5, time.Minute))
	info, err := f.q.Concurrency(f.ctx, "r")
	require.NoError(t, err)
	require.Equal(t, ConcurrencyInfo{Key: "r", Limit: 1, Rate: 5, RatePeriod: time.Minute}, info)
	require.NoError(t, f.q.SetRateLimit(f.ctx, "r", 0, 0))
	_, ok = slotsOf(t, f, "r")
	require.False(t, ok, "a value with nothing left in it is deleted")
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 0, time.Hour))
	raw, err = f.rdb.Get(f.ctx, f.q.ks.slotKey(f.q.ks.shardOf("k"), "k")).Bytes()
	require.NoError(t, err)
	require.Equal(t, byte(slotFormat), raw[1], "back to format 1 once the rate is gone")
}

// Lowering a rate keeps the latest starts it counts; raising it lets more
// start at once.
func TestRateLimitChangedWhileJobsWait(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Minute})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 100))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 3, time.Hour))
	base := f.clock.Now().Add(-time.Minute)
	for i := range 8 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
	}
	require.Len(t, claimAll(t, f), 3)
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 2, time.Hour))
	v, _ := slotsOf(t, f, "k")
	require.Len(t, v.starts, 2, "keeps the latest starts the new rate counts")
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 5, time.Hour))
	v, _ = slotsOf(t, f, "k")
	require.Len(t, v.starts, 2)
	f.clock.Advance(time.Hour + time.Millisecond)
	require.Len(t, claimAll(t, f), 5, "the new rate counts from the starts it kept; they left the window")
}

// Under Work, with many runners over several processes, the starts of a
// rate-limited key never exceed its rate in any window, by the clock that
// judged them; jobs of an unlimited key run meanwhile.
func TestRateLimitHoldsUnderWork(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: 5 * time.Second})
	f.q.clock.Fake = nil // real time: Work runs on it
	const rate, period = 4, 300 * time.Millisecond
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "hot", 50))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "hot", rate, period))
	const hot, cold = 24, 40
	for range hot {
		_, err := f.q.Enqueue(f.ctx, "hot", nil, &EnqueueOpts{ConcurrencyKey: "hot"})
		require.NoError(t, err)
	}
	for range cold {
		_, err := f.q.Enqueue(f.ctx, "cold", nil, nil)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	var starts []int64 // Redis's clock at each claim of a hot job, ms
	var coldAfterHot int
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if j.Type == "hot" {
			starts = append(starts, toMillis(j.LeaseUntil.Add(-f.q.cfg.Lease)))
		} else if len(starts) > 0 {
			coldAfterHot++
		}
		return nil, nil
	})
	ctx, cancel := context.WithTimeout(f.ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 3 {
		q := f.q
		if w > 0 {
			q = f.otherProcess(t, f.q.cfg)
		}
		wg.Go(func() {
			_ = q.Work(ctx, h, &WorkOpts{Concurrency: 6, Name: fmt.Sprintf("p%d", w), PollInterval: 20 * time.Millisecond})
		})
	}
	waitSucceeded(t, ctx, f.q, hot+cold)
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, hot, "each hot job started once")
	slices.Sort(starts)
	most := mostInWindow(starts, period)
	t.Logf("most starts in any %v: %d (limit %d); span %d ms", period, most, rate, starts[len(starts)-1]-starts[0])
	require.LessOrEqual(t, most, rate, "never more starts in a window than the rate")
	require.GreaterOrEqual(t, starts[len(starts)-1]-starts[0], int64(hot/rate-1)*period.Milliseconds(),
		"the rate spread the starts over the periods it needs")
}

func TestSlotCodecKeepsARate(t *testing.T) {
	t.Parallel()
	v := slotValue{limit: 3, leases: []slotLease{{"a", 1, 100}}, waiting: []slotWait{{"w", 9, 5, 0}},
		rate: 4, period: 1000, starts: []int64{10, 20, -3}}
	got, err := decodeSlots(string(v.encode()))
	require.NoError(t, err)
	require.Equal(t, v, got)
	rateOnly := slotValue{leases: []slotLease{}, waiting: []slotWait{}, rate: 1, period: 1, starts: []int64{}}
	got, err = decodeSlots(string(rateOnly.encode()))
	require.NoError(t, err)
	require.Equal(t, rateOnly, got, "a value with only a rate is kept")
	enc := string(v.encode())
	for name, in := range map[string]string{
		"format 2 short":   "\x94\x02\x00\x90\x90",
		"format 1 long":    "\x96\x01\x00\x90\x90\x92\x01\x01\x90",
		"rate 0":           "\x96\x02\x00\x90\x90\x92\x00\x01\x90",
		"period 0":         "\x96\x02\x00\x90\x90\x92\x01\x00\x90",
		"more starts":      "\x96\x02\x00\x90\x90\x92\x01\x01\x92\x01\x02",
		"rate too high":    "\x96\x02\x00\x90\x90\x92\xcd\xff\xff\x01\x90",
		"rate not array":   "\x96\x02\x00\x90\x90\x01\x90",
		"starts truncated": enc[:len(enc)-1],
	} {
		_, err := decodeSlots(in)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
	_, err = decodeSlots("\x94\x03\x00\x90\x90")
	require.ErrorIs(t, err, ErrUnsupportedFormat)
}

// A claim may commit after one that read a later TIME: the starts stay in
// time order, and the window drops the oldest, not the first recorded, so
// no window holds more starts than the rate. Decided without Redis.
func TestRateLimitCountsStartsRecordedOutOfOrder(t *testing.T) {
	t.Parallel()
	d := testDecider(t)
	e := &slotEntry{key: "k", v: slotValue{limit: 100, rate: 2, period: 1000}}
	take := func(now int64) bool {
		b := &slotBook{d: d, now: now}
		return b.take(e, &Job{ID: fmt.Sprint(now), LeaseUntil: time.UnixMilli(now + 60000)})
	}
	require.True(t, take(500))
	require.True(t, take(400), "read TIME before the 500 start committed")
	require.True(t, take(1401), "400 left the window")
	require.False(t, take(1450), "the window (450, 1450] holds 500 and 1401 already")
	require.Equal(t, []int64{500, 1401}, e.v.starts)
}

// A job parked by a rate is looked at again within rateRecheck, so a rate
// the operator removed or raised holds it back no longer than that.
func TestRateLimitRemovedReleasesParkedJobsWithinARecheck(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{ClaimWindow: 1, Lease: time.Hour})
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", 10))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 1, 24*time.Hour))
	base := f.clock.Now().Add(-time.Minute)
	var ids []string
	for i := range 2 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: base.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	require.Equal(t, ids[:1], claimAll(t, f))
	_, score := f.indexOf(t, ids[1])
	require.Equal(t, toMillis(f.clock.Now().Add(rateRecheck)), score, "parked for a recheck, not for a day")
	require.NoError(t, f.q.SetRateLimit(f.ctx, "k", 0, 0))
	f.clock.Advance(rateRecheck)
	require.Equal(t, ids[1:], claimAll(t, f), "the rate is gone: the job starts at its recheck")
}

// mostInWindow returns the most of starts (unix ms) within any window of
// period, sorting them first.
func mostInWindow(starts []int64, period time.Duration) int {
	slices.Sort(starts)
	most := 0
	for i := range starts {
		n := 0
		for k := i; k < len(starts) && starts[k] < starts[i]+period.Milliseconds(); k++ {
			n++
		}
		most = max(most, n)
	}
	return most
}
