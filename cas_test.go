package jobkey

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// testEngine is a Queue with nothing but the compare-and-set engine: what
// the job layer (run) needs.
func testEngine(t *testing.T, rdb redis.UniversalClient, attempts int) *Queue {
	t.Helper()
	e, err := cas.New(rdb, cas.Options{Attempts: attempts, BaseBackoff: 200 * time.Microsecond, MaxBackoff: 5 * time.Millisecond,
		Clock: &redisclock.Clock{Local: time.Now}})
	require.NoError(t, err)
	return &Queue{cas: e}
}

// incr is a CAS that adds one to the counter kept in the job's Attempt.
func incr(key string) *casTxn {
	return &casTxn{keys: []string{key}, decide: func(r *casRead) (*casPlan, error) {
		if r.errs[0] != nil {
			return nil, r.errs[0]
		}
		j := r.jobs[0]
		if j == nil {
			id := key // a job key names its job after ":job:"
			if i := strings.LastIndex(key, ":job:"); i >= 0 {
				id = key[i+len(":job:"):]
			}
			j = &Job{ID: id, State: StatePending}
		}
		j.Attempt++
		return &casPlan{writes: []casWrite{{key: key, job: j}}}, nil
	}}
}

// Every write bumps the job's revision past the value it replaces, once:
// a write that lost to a rival and was retried bumps the rival's.
func TestCASBumpsTheRevisionOncePerWrite(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	other := redistest.Client(t, nil)
	e := testEngine(t, rdb, 10)
	key := redistest.Prefix(t) + ":job:counter"
	read := func() Job {
		t.Helper()
		b, err := rdb.Get(ctx, key).Bytes()
		require.NoError(t, err)
		var j Job
		require.NoError(t, Unmarshal(b, &j))
		return j
	}
	for range 3 {
		_, _, err := e.run(ctx, incr(key))
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, read().Rev)

	// A rival writes between this write's read and its EXEC, once.
	rival := true
	txn := incr(key)
	decide := txn.decide
	txn.decide = func(r *casRead) (*casPlan, error) {
		if rival {
			rival = false
			j := read()
			j.Rev, j.Attempt = 10, 100
			b, err := Marshal(&j)
			require.NoError(t, err)
			require.NoError(t, other.Set(ctx, key, b, 0).Err())
		}
		return decide(r)
	}
	_, _, err := e.run(ctx, txn)
	require.NoError(t, err)
	j := read()
	require.EqualValues(t, 11, j.Rev, "the retried write bumps the rival's revision")
	require.Equal(t, 101, j.Attempt, "and builds on the rival's value")
	require.EqualValues(t, 1, e.cas.Counts().Conflicts)
}

func TestCASCorruptValueKept(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	key := redistest.Prefix(t) + ":job:bad"
	require.NoError(t, rdb.Set(ctx, key, "\xdd\xff\xff\xff\xff", 0).Err())
	_, _, err := e.run(ctx, incr(key))
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, key, ce.Key)
	require.Equal(t, "\xdd\xff\xff\xff\xff", rdb.Get(ctx, key).Val(), "corrupt bytes are kept")
}

// Only Redis's own MOVED, ASK and TRYAGAIN replies are retried as
// redirections, never jobkey's messages, which may quote a caller's ID.
func TestCASRetriesOnlyRedisRedirections(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	before := f.q.Metrics()
	t0 := time.Now()
	_, err := f.q.Cancel(f.ctx, "x-TRYAGAIN")
	require.ErrorIs(t, err, ErrNotFound)
	require.Less(t, time.Since(t0), time.Second)
	require.EqualValues(t, 1, f.q.Metrics().Attempts-before.Attempts, "one attempt, no retries")
}

// A connection that cannot be set up (here: a wrong password) fails a
// pipeline without an error on any command. That must come back as the
// error it is, not be read as empty answers: a wrong-type index for an
// enqueue, or no job due for a claim.
func TestConnectionSetupErrorIsReported(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	bad := redistest.Client(t, func(o *redis.Options) { o.Username, o.Password = "nobody", "wrong" })
	q := queueOn(t, bad, redistest.Prefix(t), Config{})
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.ErrorContains(t, err, "WRONGPASS")
	require.NotErrorIs(t, err, ErrWrongType)
	_, err = q.Claim(ctx, "w")
	require.ErrorContains(t, err, "WRONGPASS")
	require.NotErrorIs(t, err, ErrNoJob)
	_, err = q.Stats(ctx)
	require.ErrorContains(t, err, "WRONGPASS")
}

// A plan's values share one buffer: each must still be exactly what
// Marshal writes for its job at its new revision, and capped, so nothing
// appended to one value reaches the next.
func TestEncodePlanValuesAreWholeAndSeparate(t *testing.T) {
	t.Parallel()
	a, b, c := fullJobRetention(), fullJob(), &Job{ID: "c", State: StatePending, Payload: make([]byte, 70000)}
	read := &casRead{jobs: []*Job{{Rev: 41}, nil, {Rev: 9}}}
	plan := &casPlan{writes: []casWrite{{key: "k0", job: a}, {key: "k1", job: b}, {key: "k2", job: c}}}
	out, err := encodePlan([]string{"k0", "k1", "k2"}, read, plan)
	require.NoError(t, err)
	require.Equal(t, []uint64{42, 1, 10}, []uint64{a.Rev, b.Rev, c.Rev})
	require.Len(t, out.Writes, 3)
	for i, w := range plan.writes {
		want, err := Marshal(w.job)
		require.NoError(t, err)
		require.Equal(t, w.key, out.Writes[i].Key)
		require.Equal(t, want, out.Writes[i].Value)
		require.Equal(t, len(out.Writes[i].Value), cap(out.Writes[i].Value))
	}
	_ = append(out.Writes[0].Value, 0xff)
	want, err := Marshal(b)
	require.NoError(t, err)
	require.Equal(t, want, out.Writes[1].Value)

	bad := &casPlan{writes: []casWrite{{key: "k0", job: a}, {key: "k1", job: &Job{ID: "x"}}}}
	_, err = encodePlan([]string{"k0", "k1", "k2"}, read, bad)
	require.ErrorIs(t, err, ErrInvalid, "a job Marshal refuses is refused")
	_, err = encodePlan([]string{"k0"}, read, &casPlan{writes: []casWrite{{key: "elsewhere", job: a}}})
	require.ErrorContains(t, err, "unwatched")
}

// A job key holding another type reaches the decision as a
// *WrongTypeError naming it, not as a value to decode; a job too large to
// store is refused before anything is sent.
func TestCASReportsJobKeysOfAnotherTypeAndRefusesValuesTooLarge(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	key := redistest.Prefix(t) + ":job:t"
	require.NoError(t, rdb.LPush(ctx, key, "x").Err())
	read, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(r *casRead) (*casPlan, error) { return nil, nil }})
	require.NoError(t, err)
	require.ErrorIs(t, read.errs[0], ErrWrongType)
	require.ErrorContains(t, read.errs[0], key)
	require.Nil(t, read.jobs[0])

	big := redistest.Prefix(t) + ":job:big"
	_, _, err = e.run(ctx, &casTxn{keys: []string{big}, decide: func(*casRead) (*casPlan, error) {
		return &casPlan{writes: []casWrite{{key: big, job: &Job{ID: "big", State: StatePending, Payload: make([]byte, MaxValueBytes)}}}}, nil
	}})
	require.ErrorIs(t, err, ErrTooLarge)
	require.Zero(t, rdb.Exists(ctx, big).Val())
}

// Values are encoded into pooled buffers (encodeBufs), put back once the
// engine's Run returned. Through cut EXEC replies and reset connections,
// with values from 1 byte to past the pool's bound, every job written by
// Enqueue and completed by Work reads back as its own payload and result:
// a buffer put back while an EXEC could still write it, or that another
// transaction still held, would show as a corrupt or foreign value.
func TestEveryValueReadsBackAsItsOwnThroughLostRepliesAndPooledBuffers(t *testing.T) {
	t.Parallel()
	payload := func(i int) []byte {
		sizes := []int{1, 40, 700, 3000, 5000, 17000, 70000, 300000}
		b := make([]byte, sizes[i%len(sizes)]+i)
		seed := sha256.Sum256([]byte(fmt.Sprint("p", i)))
		for k := range b {
			b[k] = seed[k%32] ^ byte(k>>5)
		}
		return b
	}
	result := func(p []byte) []byte { s := sha256.Sum256(p); return append([]byte("r:"), s[:]...) }
	q, direct, proxy := lostRepliesPair(t, "encpool")
	ctx := context.Background()
	proxy.Set(faultproxy.Faults{ExecCutProb: 0.2, ResetProb: 0.001})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		return result(j.Payload), nil
	}), &WorkOpts{Concurrency: 4, Prefetch: 4, PollInterval: 20 * time.Millisecond})
	const writers, per = 6, 25
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for k := range per {
				i := w*per + k
				id := fmt.Sprint("j", i)
				for try := 0; ; try++ {
					_, err := q.Enqueue(ctx, "t", payload(i), &EnqueueOpts{ID: id, MaxAttempts: 50})
					if err == nil || errors.Is(err, ErrJobExists) {
						break // an enqueue whose reply was lost is found by its ID
					}
					if try == 200 {
						errs <- fmt.Errorf("enqueue %s kept failing: %w", id, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	waitForIn(t, 120*time.Second, "every job done", func() bool {
		st, err := direct.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded >= writers*per && st.Pending == 0 && st.Active == 0
	})
	proxy.Set(faultproxy.Faults{})
	stop()
	require.NotZero(t, proxy.Counts().ExecCuts)
	for i := range writers * per {
		id, p := fmt.Sprint("j", i), payload(i)
		j, err := direct.Get(ctx, id)
		require.NoError(t, err, "job %s", id)
		require.Equal(t, id, j.ID)
		require.True(t, string(p) == string(j.Payload), "job %s: a payload of %d bytes read back as %d bytes, not its own", id, len(p), len(j.Payload))
		require.Equal(t, StateSucceeded, j.State, "job %s", id)
		require.Equal(t, result(p), j.Result, "job %s: a result not its own", id)
	}
	evs, _ := readEvents(t, direct, "")
	checkEventChains(t, direct, evs, true)
}
