package jobkey

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fakeClock is a Config.Now that tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fixture struct {
	q     *Queue
	rdb   *redis.Client
	hook  *rttcount.Hook
	clock *fakeClock
	ctx   context.Context
}

// setup returns a queue under its own random prefix on the shared real
// Redis, with a fake clock and a round-trip hook. cfg may be nil.
func setup(t *testing.T, cfg *Config) *fixture {
	t.Helper()
	redistest.RequireReal(t)
	rdb, hook := hooked(t, 0)
	clock := newClock()
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = redistest.Prefix(t)
	if c.Backoff == nil {
		c.Backoff = func(attempt int) time.Duration { return time.Duration(attempt) * time.Minute }
	}
	q, err := NewQueue(rdb, "q", &c)
	require.NoError(t, err)
	q.clock.fake = clock.Now // Redis's clock, as far as the queue can tell
	require.NoError(t, q.check(context.Background(), true), "the one-time checks, outside every count")
	return &fixture{q: q, rdb: rdb, hook: hook, clock: clock, ctx: context.Background()}
}

// jobErrs returns the per-job errors of a batch call's error: a
// *BatchError's Errs, or n nils when err is nil.
func jobErrs(t *testing.T, err error, n int) []error {
	t.Helper()
	if err == nil {
		return make([]error, n)
	}
	var be *BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, n)
	return be.Errs
}

// indexOf returns the index and score the raw keys hold for id, failing if
// the ID sits in more than one index.
func (f *fixture) indexOf(t *testing.T, id string) (string, int64) {
	t.Helper()
	_, shard := f.q.ks.jobKeyOf(id)
	found, score := "", int64(0)
	for _, idx := range []string{idxReady, idxLeased, idxSucceeded, idxFailed, idxCanceled} {
		s, err := f.rdb.ZScore(f.ctx, f.q.ks.index(shard, idx), id).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		require.NoError(t, err)
		require.Empty(t, found, "job %s is in %s and %s", id, found, idx)
		found, score = idx, int64(s)
	}
	return found, score
}

// requireIndexed checks the raw index agrees with the stored value.
func (f *fixture) requireIndexed(t *testing.T, j *Job) {
	t.Helper()
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	idx, score := f.indexOf(t, j.ID)
	want := derive(got)
	require.Equal(t, want.index, idx, "index of %s (%s)", j.ID, got.State)
	require.Equal(t, want.score, score, "score of %s", j.ID)
}

func TestNewQueueRefuses(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	for name, c := range map[string]struct {
		queue string
		cfg   Config
		want  string
	}{
		"empty name":     {"", Config{}, "queue name is empty"},
		"brace":          {"a{b", Config{}, "hash tag"},
		"close brace":    {"a}", Config{}, "hash tag"},
		"colon":          {"a:b", Config{}, "contains"},
		"space":          {"a b", Config{}, "space"},
		"long":           {strings.Repeat("q", 200), Config{}, "limit 128"},
		"shards":         {"q", Config{Shards: 5000}, "Shards"},
		"lease":          {"q", Config{Lease: time.Millisecond}, "Lease"},
		"attempts":       {"q", Config{MaxAttempts: -1}, "MaxAttempts"},
		"attempts limit": {"q", Config{MaxAttempts: MaxAttemptsLimit + 1}, "MaxAttempts"},
		"value limit":    {"q", Config{MaxValueBytes: MaxValueBytes + 1}, "MaxValueBytes"},
		"prefix brace":   {"q", Config{Prefix: "x{"}, "hash tag"},
		"cas backoff":    {"q", Config{CASBackoff: time.Second, CASMaxBackoff: time.Millisecond}, "CASBackoff"},
		"two at once":    {"q", Config{Shards: -1, ClaimWindow: -2}, "ClaimWindow"},
		"negative batch": {"q", Config{MaxBatch: -1}, "MaxBatch"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewQueue(rdb, c.queue, &c.cfg)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err := NewQueue(nil, "q", nil)
	require.Error(t, err)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	_, err = NewQueue(ring, "q", nil)
	require.ErrorContains(t, err, "unsupported client")
	require.NoError(t, ring.Close())
	q, err := NewQueue(rdb, "q", nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, q.cfg.Lease)
	require.Equal(t, 25, q.cfg.MaxAttempts)
}

func TestEnqueueAndGet(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	now := f.clock.Now()

	j, err := f.q.Enqueue(f.ctx, "email", []byte("hi"), nil)
	require.NoError(t, err)
	require.Len(t, j.ID, 26, "a ULID")
	require.Equal(t, StatePending, j.State)
	require.Equal(t, now, j.RunAt)
	require.EqualValues(t, 1, j.Rev)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, j, got)
	f.requireIndexed(t, j)

	d, err := f.q.Enqueue(f.ctx, "email", nil, &EnqueueOpts{ID: "later", Delay: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, now.Add(time.Minute), d.RunAt)
	require.Equal(t, 3, d.MaxAttempts)
	f.requireIndexed(t, d)

	at := now.Add(time.Hour)
	a, err := f.q.Enqueue(f.ctx, "email", nil, &EnqueueOpts{ID: "at", RunAt: at})
	require.NoError(t, err)
	require.Equal(t, at, a.RunAt)

	_, err = f.q.Get(f.ctx, "nope")
	require.ErrorIs(t, err, ErrNotFound)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Pending: 3, Due: 1, Scheduled: 2}, st)
}

func TestEnqueueIdempotentByID(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	first, err := f.q.Enqueue(f.ctx, "t", []byte("one"), &EnqueueOpts{ID: "same"})
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	again, err := f.q.Enqueue(f.ctx, "t", []byte("two"), &EnqueueOpts{ID: "same"})
	require.ErrorIs(t, err, ErrJobExists)
	var je *JobExistsError
	require.ErrorAs(t, err, &je)
	require.Equal(t, first, again, "the stored job comes back")
	got, err := f.q.Get(f.ctx, "same")
	require.NoError(t, err)
	require.Equal(t, []byte("one"), got.Payload, "nothing was written")
	require.EqualValues(t, 1, got.Rev)
}

func TestEnqueueRefusesBeforeWriting(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxValueBytes: 1024})
	cases := map[string]struct {
		typ     string
		payload []byte
		opts    *EnqueueOpts
		is      error
	}{
		"too large":    {"t", make([]byte, 2000), nil, ErrTooLarge},
		"empty type":   {"", nil, nil, nil},
		"long ID":      {"t", nil, &EnqueueOpts{ID: strings.Repeat("i", MaxIDLen+1)}, nil},
		"brace ID":     {"t", nil, &EnqueueOpts{ID: "a{b}"}, nil},
		"neg delay":    {"t", nil, &EnqueueOpts{Delay: -time.Second}, nil},
		"neg attempts": {"t", nil, &EnqueueOpts{MaxAttempts: -1}, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f.hook.Reset()
			_, err := f.q.Enqueue(f.ctx, c.typ, c.payload, c.opts)
			require.Error(t, err)
			if c.is != nil {
				require.ErrorIs(t, err, c.is)
			}
			require.Zero(t, f.hook.RTT.Load(), "refused before any Redis call")
		})
	}
	keys, err := f.rdb.Keys(f.ctx, f.q.cfg.Prefix+"*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{f.q.ks.metaKey()}, keys, "nothing but the queue's shard count, stored by the fixture's first call")
}

func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 4})
	_, err := f.q.Enqueue(f.ctx, "t", []byte("old"), &EnqueueOpts{ID: "x3"})
	require.NoError(t, err)
	var batch []NewJob
	for i := range 10 {
		batch = append(batch, NewJob{Type: "t", Payload: []byte{byte(i)}, Opts: &EnqueueOpts{ID: fmt.Sprintf("x%d", i)}})
	}
	batch = append(batch, NewJob{Type: "t", Opts: &EnqueueOpts{ID: "x5"}}) // repeated within the batch
	f.hook.Reset()
	jobs, err := f.q.EnqueueMany(f.ctx, batch)
	require.ErrorIs(t, err, ErrJobExists)
	require.EqualValues(t, 6, f.hook.RTT.Load(), "11 jobs in batches of 4: three transactions of two round trips")
	require.Len(t, jobs, 11)
	require.Equal(t, []byte("old"), jobs[3].Payload, "the stored job is returned for a taken ID")
	require.Equal(t, []byte{5}, jobs[10].Payload, "a repeated ID returns the first of the batch")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, st.Pending)
	for _, j := range jobs {
		f.requireIndexed(t, j)
	}

	// A bad job anywhere refuses the whole batch before anything is written.
	_, err = f.q.EnqueueMany(f.ctx, []NewJob{{Type: "t", Opts: &EnqueueOpts{ID: "fine"}}, {Type: ""}})
	require.ErrorContains(t, err, "batch job 1")
	_, err = f.q.Get(f.ctx, "fine")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("p"), nil)
	require.NoError(t, err)

	c, err := f.q.Claim(f.ctx, "w1")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	require.Equal(t, StateActive, c.State)
	require.Equal(t, 1, c.Attempt)
	require.Equal(t, "w1", c.LeaseOwner)
	require.Equal(t, f.clock.Now().Add(30*time.Second), c.LeaseUntil)
	f.requireIndexed(t, c)

	_, err = f.q.Claim(f.ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob, "a held lease is not claimable")

	f.clock.Advance(20 * time.Second)
	e, err := f.q.Extend(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, f.clock.Now().Add(30*time.Second), e.LeaseUntil)
	f.requireIndexed(t, e)

	done, err := f.q.Complete(f.ctx, c, []byte("result"))
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, done.State)
	require.Equal(t, []byte("result"), done.Result)
	f.requireIndexed(t, done)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.jobKey(0, j.ID)).Result()
	require.NoError(t, err)
	require.InDelta(t, (24 * time.Hour).Seconds(), ttl.Seconds(), 60, "retention is the key's own expiry")

	// A Complete retried after its reply was lost is a no-op success.
	again, err := f.q.Complete(f.ctx, c, []byte("result"))
	require.NoError(t, err)
	require.Equal(t, done.Rev, again.Rev)

	_, err = f.q.Extend(f.ctx, c)
	require.ErrorIs(t, err, ErrLeaseLost)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 1}, st)
}

func TestFailRetriesThenFails(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 2})
	require.NoError(t, err)

	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	p, err := f.q.Fail(f.ctx, c, errors.New("boom"))
	require.NoError(t, err)
	require.Equal(t, StatePending, p.State)
	require.Equal(t, "boom", p.LastError)
	require.Equal(t, f.clock.Now().Add(time.Minute), p.RunAt, "backoff of attempt 1")
	f.requireIndexed(t, p)

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "not due during backoff")
	f.clock.Advance(time.Minute)
	c2, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, 2, c2.Attempt)
	_, err = f.q.Fail(f.ctx, c, errors.New("stale"))
	require.ErrorIs(t, err, ErrLeaseLost, "attempt 1's copy is fenced off")

	final, err := f.q.Fail(f.ctx, c2, errors.New(strings.Repeat("é", MaxErrorLen)))
	require.NoError(t, err)
	require.Equal(t, StateFailed, final.State)
	require.LessOrEqual(t, len(final.LastError), MaxErrorLen)
	require.True(t, strings.HasPrefix(final.LastError, "éé"))
	f.requireIndexed(t, final)

	r, err := f.q.Retry(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, r.State)
	require.Zero(t, r.Attempt)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.jobKey(0, j.ID)).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a retried job no longer expires")
	f.requireIndexed(t, r)
}

func TestSkipRetryFailsAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	failed, err := f.q.Fail(f.ctx, c, fmt.Errorf("bad input: %w", ErrSkipRetry))
	require.NoError(t, err)
	require.Equal(t, StateFailed, failed.State)
}

func TestRelease(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	r, err := f.q.Release(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, StatePending, r.State)
	require.Zero(t, r.Attempt, "the attempt is not spent")
	f.requireIndexed(t, r)
	again, err := f.q.Release(f.ctx, c)
	require.NoError(t, err, "a Release retried after a lost reply finds its own write")
	require.Equal(t, r.Rev, again.Rev, "and writes nothing")
	c2, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, 1, c2.Attempt)
	_, err = f.q.Release(f.ctx, c)
	require.ErrorIs(t, err, ErrLeaseLost, "once claimed again, the old claim is fenced off")
}

// A claims; A's lease expires; B claims; A's Complete is fenced off; B
// completes and the result is B's.
func TestZombieFencing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "A")
	require.NoError(t, err)
	f.clock.Advance(31 * time.Second)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.ExpiredLeases)
	b, err := f.q.Claim(f.ctx, "B")
	require.NoError(t, err)
	require.Equal(t, j.ID, b.ID)
	require.Equal(t, 2, b.Attempt)

	for name, op := range map[string]func() error{
		"complete": func() error { _, err := f.q.Complete(f.ctx, a, []byte("A")); return err },
		"extend":   func() error { _, err := f.q.Extend(f.ctx, a); return err },
		"fail":     func() error { _, err := f.q.Fail(f.ctx, a, errors.New("A")); return err },
		"release":  func() error { _, err := f.q.Release(f.ctx, a); return err },
	} {
		err := op()
		require.ErrorIs(t, err, ErrLeaseLost, name)
		var ll *LeaseLostError
		require.ErrorAs(t, err, &ll)
		require.Equal(t, "B", ll.Now.LeaseOwner)
	}
	done, err := f.q.Complete(f.ctx, b, []byte("B"))
	require.NoError(t, err)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, []byte("B"), got.Result)
	require.Equal(t, done, got)
}

func TestExpiredLastAttemptFails(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	f.clock.Advance(time.Minute)
	_, err = f.q.Claim(f.ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateFailed, got.State)
	require.Contains(t, got.LastError, "attempt 1/1")
	require.Contains(t, got.LastError, "expired")
	f.requireIndexed(t, got)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	p, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "p"})
	require.NoError(t, err)
	c, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, c.State)
	f.requireIndexed(t, c)
	again, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, c.Rev, again.Rev, "canceling twice writes nothing")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	ca, err := f.q.Cancel(f.ctx, a.ID)
	require.NoError(t, err)
	f.requireIndexed(t, ca)
	_, err = f.q.Complete(f.ctx, a, nil)
	require.ErrorIs(t, err, ErrLeaseLost, "the canceled job's worker is fenced off")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "s"})
	require.NoError(t, err)
	s, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, s, nil)
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, "s")
	var se *StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, StateSucceeded, se.State)
	_, err = f.q.Retry(f.ctx, "s")
	require.ErrorAs(t, err, &se)
	_, err = f.q.Cancel(f.ctx, "missing")
	require.ErrorIs(t, err, ErrNotFound)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 1, Canceled: 2}, st)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{Delay: time.Hour})
	require.NoError(t, err)
	u, err := f.q.Update(f.ctx, j.ID, func(cur *Job) error {
		cur.Payload = []byte("v2")
		cur.RunAt = f.clock.Now()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []byte("v2"), u.Payload)
	require.EqualValues(t, 2, u.Rev)
	f.requireIndexed(t, u)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "the new RunAt made it due")
	require.Equal(t, []byte("v2"), c.Payload)

	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.State = StateSucceeded; return nil })
	require.ErrorContains(t, err, "may not change State")
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { return errors.New("changed my mind") })
	require.EqualError(t, err, "changed my mind")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, c, got, "refused edits wrote nothing")
}

// A hint that disagrees with its value is put right by the claimer that
// finds it, in the same EXEC.
func TestClaimRepairsTamperedHints(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ready := f.q.ks.index(0, idxReady)
	now := toMillis(f.clock.Now())

	// A member whose job does not exist.
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now), Member: "ghost"}).Err())
	// A job that is scheduled later, but whose entry says due.
	later, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "later", Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now - 1000), Member: "later"}).Err())
	// A succeeded job whose ID was put back into ready.
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "done", Delay: 2 * time.Hour})
	require.NoError(t, err)
	f.clock.Advance(2 * time.Hour)
	d, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	d, err = f.q.Complete(f.ctx, d, nil)
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now), Member: "done"}).Err())
	f.clock.Advance(-2 * time.Hour)

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	_, err = f.rdb.ZScore(f.ctx, ready, "ghost").Result()
	require.ErrorIs(t, err, redis.Nil, "the entry without a job is gone")
	f.requireIndexed(t, later)
	f.requireIndexed(t, d)
}

func TestWrongTypeIndexRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ready := f.q.ks.index(0, idxReady)
	require.NoError(t, f.rdb.Set(f.ctx, ready, "not a zset", 0).Err())
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, ready, wt.Key)
	_, err = f.q.Get(f.ctx, "x")
	require.ErrorIs(t, err, ErrNotFound, "nothing was written")
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorAs(t, err, &wt)
	require.Equal(t, ready, wt.Key)
}

// Round trips, counted by the hook, within the budget of docs/design.md, section 4.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	measure := func(name string, budget int64, op func() error) {
		t.Helper()
		f.hook.Reset()
		require.NoError(t, op(), name)
		require.LessOrEqual(t, f.hook.RTT.Load(), budget, name)
		t.Logf("%-22s %d round trips, %d commands", name, f.hook.RTT.Load(), f.hook.Cmds.Load())
	}
	measure("Claim (nothing due)", 1, func() error {
		_, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return nil
		}
		return fmt.Errorf("want ErrNoJob, got %v", err)
	})
	var j *Job
	measure("Enqueue", 2, func() (err error) { j, err = f.q.Enqueue(f.ctx, "t", nil, nil); return })
	measure("Enqueue (caller ID)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "mine", Delay: time.Hour})
		return
	})
	batch := make([]NewJob, 100)
	for i := range batch {
		batch[i] = NewJob{Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}
	}
	measure("EnqueueMany(100)", 2, func() (err error) { _, err = f.q.EnqueueMany(f.ctx, batch); return })
	measure("Get", 1, func() (err error) { _, err = f.q.Get(f.ctx, j.ID); return })
	var c *Job
	measure("Claim", 3, func() (err error) { c, err = f.q.Claim(f.ctx, "w"); return })
	measure("Extend", 2, func() (err error) { c, err = f.q.Extend(f.ctx, c); return })
	measure("Fail", 2, func() (err error) { _, err = f.q.Fail(f.ctx, c, errors.New("x")); return })
	f.clock.Advance(time.Minute)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("Release", 2, func() (err error) { _, err = f.q.Release(f.ctx, c); return })
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("Complete", 2, func() (err error) { _, err = f.q.Complete(f.ctx, c, []byte("r")); return })
	measure("Cancel", 2, func() (err error) { _, err = f.q.Cancel(f.ctx, "mine"); return })
	measure("Retry", 2, func() (err error) { _, err = f.q.Retry(f.ctx, "mine"); return })
	measure("Stats", 1, func() (err error) { _, err = f.q.Stats(f.ctx); return })
}

// 1,000 jobs, 32 claimers on separate connections: every job is completed
// exactly once and no claim is handed out twice while its lease holds.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const jobs, claimers = 1000, 32
	producer, err := NewQueue(redistest.Client(t, nil), "q", &Config{Prefix: prefix})
	require.NoError(t, err)
	batch := make([]NewJob, jobs)
	for i := range batch {
		batch[i] = NewJob{Type: "t", Payload: []byte(fmt.Sprint(i))}
	}
	_, err = producer.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	var mu sync.Mutex
	claims := map[string][]string{} // job -> claimers
	completions := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for w := range claimers {
		q, err := NewQueue(redistest.Client(t, func(o *redis.Options) { o.PoolSize = 2 }), "q", &Config{Prefix: prefix})
		require.NoError(t, err)
		name := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for {
				j, err := q.Claim(ctx, name)
				if errors.Is(err, ErrNoJob) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				claims[j.ID] = append(claims[j.ID], name)
				mu.Unlock()
				if _, err := q.Complete(ctx, j, []byte(name)); err != nil {
					errs <- fmt.Errorf("complete %s: %w", j.ID, err)
					return
				}
				mu.Lock()
				completions[j.ID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, completions, jobs)
	for id, n := range completions {
		require.Equal(t, 1, n, "job %s completed %d times", id, n)
		require.Len(t, claims[id], 1, "job %s claimed by %v while the lease held", id, claims[id])
	}
	st, err := producer.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: jobs}, st)
	m := producer.Metrics()
	t.Logf("producer: %+v", m)
}

func TestShardsSpreadAndStats(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	var ids []string
	for i := range 40 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("job-%d", i)})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	used := map[int]bool{}
	for _, id := range ids {
		_, s := f.q.ks.jobKeyOf(id)
		used[s] = true
	}
	require.Len(t, used, 4)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 40, st.Pending)
	var got []string
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		got = append(got, j.ID)
	}
	sort.Strings(got)
	sort.Strings(ids)
	require.Equal(t, ids, got)
}

func TestClaimManyCompleteMany(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	batch := make([]NewJob, 40)
	for i := range batch {
		batch[i] = NewJob{Type: "t", Payload: []byte{byte(i)}}
	}
	_, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)

	f.hook.Reset()
	got, err := f.q.ClaimMany(f.ctx, "w", 32)
	require.NoError(t, err)
	require.Len(t, got, 32)
	require.EqualValues(t, 3, f.hook.RTT.Load())
	for _, j := range got {
		require.Equal(t, StateActive, j.State)
		f.requireIndexed(t, j)
	}

	// One lease is lost before the batch completes: only that job fails.
	const victim = 5
	_, err = f.q.update(f.ctx, got[victim].ID, nil, func(cur *Job, _ time.Time) (*Job, error) {
		cur.Attempt++
		cur.LeaseOwner = "thief"
		cur.LeaseToken = newToken()
		return cur, nil
	}, "")
	require.NoError(t, err)
	results := make([][]byte, len(got))
	for i := range results {
		results[i] = []byte(fmt.Sprint(i))
	}
	f.hook.Reset()
	done, err := f.q.CompleteMany(f.ctx, got, results)
	errs := jobErrs(t, err, len(got))
	require.EqualValues(t, 2, f.hook.RTT.Load())
	for i, j := range got {
		if i == victim {
			require.ErrorIs(t, errs[i], ErrLeaseLost)
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, StateSucceeded, done[i].State)
		require.Equal(t, results[i], done[i].Result)
		f.requireIndexed(t, j)
	}
	// Retried after a lost reply: no-op successes, nothing rewritten.
	again, err := f.q.CompleteMany(f.ctx, got, results)
	errs = jobErrs(t, err, len(got))
	for i := range got {
		if i != victim {
			require.NoError(t, errs[i])
			require.Equal(t, done[i].Rev, again[i].Rev)
		}
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 31, st.Succeeded)
	require.EqualValues(t, 1, st.Active)
	require.EqualValues(t, 8, st.Pending)

	_, err = f.q.ClaimMany(f.ctx, "w", 0)
	require.Error(t, err)
	_, err = f.q.CompleteMany(f.ctx, []*Job{got[0], got[0]}, nil)
	require.ErrorContains(t, err, "appears twice")
}

// The fault of the failing group (docs/design.md, section 1), injected into jobkey: the
// index the enqueue writes holds a string. Nothing is written, the error
// names the key, and the other shards' jobs keep flowing.
func TestInjectedFaultWritesNothingOthersFlow(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	id := "8123"
	key, shard := f.q.ks.jobKeyOf(id)
	broken := f.q.ks.index(shard, idxReady)
	require.NoError(t, f.rdb.Set(f.ctx, broken, "not a zset", 0).Err())

	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, broken, wt.Key)
	require.Zero(t, f.rdb.Exists(f.ctx, key).Val(), "no record")
	require.Equal(t, "not a zset", f.rdb.Get(f.ctx, broken).Val())

	flowed := 0
	for i := 0; flowed < 10; i++ {
		other := fmt.Sprintf("job-%d", i)
		if _, s := f.q.ks.jobKeyOf(other); s == shard {
			continue
		}
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: other})
		require.NoError(t, err)
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
		flowed++
	}
	_, err = f.q.Stats(f.ctx)
	require.ErrorAs(t, err, &wt, "Stats reports the broken index rather than a wrong count")
	require.Equal(t, broken, wt.Key)
}

// A batch reads its job keys with MGET and EXISTS; a job key of another
// type (MGET says nil, EXISTS counts it) is found and named, and nothing
// of the batch is written.
func TestEnqueueManyFindsWrongTypeJobKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	bad, _ := f.q.ks.jobKeyOf("b")
	require.NoError(t, f.rdb.RPush(f.ctx, bad, "x").Err())
	jobs, err := f.q.EnqueueMany(f.ctx, []NewJob{
		{Type: "t", Opts: &EnqueueOpts{ID: "a"}}, {Type: "t", Opts: &EnqueueOpts{ID: "b"}}, {Type: "t", Opts: &EnqueueOpts{ID: "c"}},
	})
	// The unreadable key is b's own error; a and c are written.
	errs := jobErrs(t, err, 3)
	var wt *WrongTypeError
	require.ErrorAs(t, errs[1], &wt)
	require.Equal(t, bad, wt.Key)
	for _, i := range []int{0, 2} {
		require.NoError(t, errs[i])
		f.requireIndexed(t, jobs[i])
	}
	require.EqualValues(t, 1, f.rdb.LLen(f.ctx, bad).Val(), "the foreign key is untouched")
}

// A plan that writes an index nobody predicted pays one more round trip of
// TYPE checks under the WATCH; a wrong type found there refuses the write.
func TestLateTypeCheckRefusesBeforeWrite(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{ID: "late", Delay: time.Hour})
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.Del(f.ctx, keys.Ready).Err())
	require.NoError(t, f.rdb.Set(f.ctx, keys.Ready, "not a zset", 0).Err())
	before := f.rdb.Get(f.ctx, keys.Job).Val()

	f.hook.Reset()
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.RunAt = f.clock.Now(); return nil })
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, keys.Ready, wt.Key)
	require.EqualValues(t, 3, f.hook.RTT.Load(), "WATCH+GET, late TYPE, UNWATCH")
	require.Equal(t, before, f.rdb.Get(f.ctx, keys.Job).Val(), "the value is as it was")
	require.Equal(t, "not a zset", f.rdb.Get(f.ctx, keys.Ready).Val())
}

// MaxAttempts past what a stored value can hold is refused wherever it
// comes in, before anything is written; it used to be written and then
// read back as corrupt, so the job never ran (issue 9, item 8).
func TestMaxAttemptsIsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	huge := MaxAttemptsLimit + 1
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "huge", MaxAttempts: huge})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.q.Get(f.ctx, "huge")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.q.EnqueueMany(f.ctx, []NewJob{{Type: "t", Opts: &EnqueueOpts{MaxAttempts: huge}}})
	require.ErrorIs(t, err, ErrInvalid)

	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: MaxAttemptsLimit})
	require.NoError(t, err, "the limit itself is fine")
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = huge; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err, "the value still reads")
	require.Equal(t, MaxAttemptsLimit, got.MaxAttempts)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
}
