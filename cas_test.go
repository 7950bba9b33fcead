package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func testEngine(t *testing.T, rdb redis.UniversalClient, attempts int) *casEngine {
	t.Helper()
	e, err := newCASEngine(rdb, casLimits{attempts: attempts, baseBackoff: 200 * time.Microsecond, maxBackoff: 5 * time.Millisecond},
		&redisclock.Clock{Local: time.Now})
	require.NoError(t, err)
	return e
}

// setJob writes a job value directly, bypassing the engine.
func setJob(t *testing.T, rdb redis.Cmdable, key string, j *Job) {
	t.Helper()
	b, err := Marshal(j)
	require.NoError(t, err)
	require.NoError(t, rdb.Set(context.Background(), key, b, 0).Err())
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

func TestCASNoLostUpdate(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
	e := testEngine(t, rdb, 10_000)
	key := redistest.Prefix(t) + ":job:counter"

	const workers, each = 16, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for range each {
				if _, _, err := e.run(ctx, incr(key)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	b, err := rdb.Get(ctx, key).Bytes()
	require.NoError(t, err)
	var j Job
	require.NoError(t, Unmarshal(b, &j))
	require.Equal(t, workers*each, j.Attempt, "an increment was lost")
	require.EqualValues(t, workers*each, j.Rev, "every write bumps the revision once")
	m := e.m.snapshot()
	require.Positive(t, m.Conflicts, "16 writers on one key must have collided")
	require.Equal(t, int64(workers*each)+m.Conflicts, m.Attempts, "each conflict is retried")
	t.Logf("%d increments: %d attempts, %d conflicts", workers*each, m.Attempts, m.Conflicts)
}

func TestCASRoundTrips(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb, hook := hooked(t, 1)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":job:a"
	require.NoError(t, rdb.Ping(ctx).Err()) // dial the one connection outside the count

	// An uncontended write: WATCH+GET (+TYPE), then MULTI..EXEC.
	txn := incr(key)
	txn.checks = []typeCheck{{key: p + ":ready", want: "zset"}}
	hook.Reset()
	_, _, err := e.run(ctx, txn)
	require.NoError(t, err)
	require.EqualValues(t, 2, hook.RTT.Load())
	require.EqualValues(t, 2, e.m.snapshot().RoundTrips)
	// watch, time, get, type | multi, set, exec
	require.EqualValues(t, 7, hook.Cmds.Load())
	require.EqualValues(t, 7, e.m.snapshot().Commands)

	// A "write nothing" decision: WATCH+GET, then UNWATCH.
	hook.Reset()
	_, plan, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) { return nil, nil }})
	require.NoError(t, err)
	require.Nil(t, plan)
	require.EqualValues(t, 2, hook.RTT.Load())
	require.EqualValues(t, 1, e.m.snapshot().Unwatches)
	require.EqualValues(t, 4, e.m.snapshot().RoundTrips, "engine and hook agree")
}

// Every path that does not reach EXEC must leave the pooled connection
// without a watch. The pool has one connection, so a leftover watch on key
// would abort the unrelated transaction that follows.
func TestCASWatchHygiene(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb, _ := hooked(t, 1)
	other := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":job:w"
	setJob(t, other, key, &Job{ID: "w", State: StatePending})
	require.NoError(t, other.Set(ctx, p+":str", "x", 0).Err())

	// unrelated runs a MULTI/EXEC on rdb's only pooled connection after key
	// changed. (Client.TxPipelined may use a connection of its own in go-redis
	// v9.23; Client.Watch borrows from the pool, as the engine does.)
	unrelated := func(t *testing.T) error {
		t.Helper()
		setJob(t, other, key, &Job{ID: "w", State: StatePending, Attempt: 9})
		return rdb.Watch(ctx, func(tx *redis.Tx) error {
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key+":unrelated", "v", 0)
				return nil
			})
			return err
		})
	}

	t.Run("control: a leftover watch does abort", func(t *testing.T) {
		conn := rdb.Conn()
		require.NoError(t, conn.Do(ctx, "watch", key).Err())
		require.NoError(t, conn.Close()) // back to the pool, still watching
		require.ErrorIs(t, unrelated(t), redis.TxFailedErr)
	})

	paths := map[string]func() error{
		"write nothing": func() error {
			_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) { return nil, nil }})
			return err
		},
		"decision fails": func() error {
			_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) { return nil, errors.New("no") }})
			require.EqualError(t, err, "no")
			return nil
		},
		"wrong type refused": func() error {
			txn := incr(key)
			txn.checks = []typeCheck{{key: p + ":str", want: "zset"}}
			_, _, err := e.run(ctx, txn)
			require.ErrorIs(t, err, ErrWrongType)
			return nil
		},
		"too large": func() error {
			_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) {
				return &casPlan{writes: []casWrite{{key: key, job: &Job{State: StatePending, Payload: make([]byte, MaxValueBytes)}}}}, nil
			}})
			require.ErrorIs(t, err, ErrTooLarge)
			return nil
		},
		"ctx canceled after the read": func() error {
			cctx, cancel := context.WithCancel(ctx)
			_, _, err := e.run(cctx, &casTxn{keys: []string{key}, decide: func(r *casRead) (*casPlan, error) {
				cancel()
				return &casPlan{writes: []casWrite{{key: key, job: r.jobs[0]}}}, nil
			}})
			require.ErrorIs(t, err, context.Canceled)
			return nil
		},
	}
	for name, run := range paths {
		t.Run(name, func(t *testing.T) {
			before := e.m.snapshot().Unwatches
			require.NoError(t, run())
			require.Equal(t, before+1, e.m.snapshot().Unwatches, "UNWATCH sent")
			require.NoError(t, unrelated(t), "a stale watch aborted an unrelated transaction")
		})
	}
}

func TestCASStepError(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":job:s"
	require.NoError(t, rdb.Set(ctx, p+":pending", "a string, not a set", 0).Err())

	// The pending key is not declared for a type check, so the step reaches
	// EXEC and errors while applying; the steps around it apply.
	_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) {
		return &casPlan{
			writes: []casWrite{{key: key, job: &Job{ID: "s", State: StatePending}}},
			steps:  [][]any{{"sadd", p + ":pending", key}, {"incr", p + ":count"}},
		}, nil
	}})
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, ErrStep)
	require.False(t, se.Aborted)
	require.Len(t, se.Steps, 3)
	require.NoError(t, se.Steps[0].Err)
	require.ErrorContains(t, se.Steps[1].Err, "WRONGTYPE")
	require.Equal(t, "sadd "+p+":pending", se.Steps[1].Cmd)
	require.NoError(t, se.Steps[2].Err)
	require.Contains(t, err.Error(), "[ok, error, ok]")
	// What Redis did, which is exactly what the step list says.
	require.EqualValues(t, 1, rdb.Exists(ctx, key).Val())
	require.Equal(t, "1", rdb.Get(ctx, p+":count").Val())
}

func TestCASExecAbortAppliesNothing(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	key := redistest.Prefix(t) + ":job:x"
	_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(*casRead) (*casPlan, error) {
		return &casPlan{
			writes: []casWrite{{key: key, job: &Job{ID: "x", State: StatePending}}},
			steps:  [][]any{{"zadd", key + ":z"}}, // wrong arity: refused while queued
		}, nil
	}})
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.True(t, se.Aborted)
	require.Contains(t, err.Error(), "EXECABORT")
	require.Zero(t, rdb.Exists(ctx, key).Val(), "nothing applied")
}

func TestCASWrongTypeRefusedBeforeWrite(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":job:t"
	require.NoError(t, rdb.Set(ctx, p+":ready", "oops", 0).Err())
	txn := incr(key)
	txn.checks = []typeCheck{{key: p + ":ready", want: "zset"}}
	_, _, err := e.run(ctx, txn)
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, p+":ready", wt.Key)
	require.Equal(t, "string", wt.Got)
	require.Zero(t, rdb.Exists(ctx, key).Val(), "nothing written")

	// A job key holding another type is reported for that key, not decoded.
	require.NoError(t, rdb.LPush(ctx, key, "x").Err())
	read, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(r *casRead) (*casPlan, error) { return nil, nil }})
	require.NoError(t, err)
	require.ErrorIs(t, read.errs[0], ErrWrongType)
	require.ErrorContains(t, read.errs[0], key)
}

func TestCASGivesUpWithConflict(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	other := redistest.Client(t, nil)
	e := testEngine(t, rdb, 4)
	key := redistest.Prefix(t) + ":job:c"
	n := 0
	_, _, err := e.run(ctx, &casTxn{keys: []string{key}, decide: func(r *casRead) (*casPlan, error) {
		n++
		setJob(t, other, key, &Job{ID: "c", State: StatePending, Attempt: 100 + n}) // a rival write every time
		return &casPlan{writes: []casWrite{{key: key, job: &Job{ID: "c", State: StateFailed}}}}, nil
	}})
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, ErrConflict)
	require.Equal(t, 4, ce.Attempts)
	require.Contains(t, err.Error(), "4 attempts")
	var j Job
	require.NoError(t, Unmarshal([]byte(other.Get(ctx, key).Val()), &j))
	require.Equal(t, StatePending, j.State, "the losing write never landed")
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

	require.False(t, redirected(errors.New("TRYAGAIN not a redis reply")))
	require.False(t, redirected(fmt.Errorf("jobkey: job %q: %w", "MOVED 1 x", ErrNotFound)))
	require.True(t, redirected(fmt.Errorf("wrapped: %w", replyErr("TRYAGAIN Multiple keys request during rehashing of slot"))))
	require.True(t, redirected(replyErr("MOVED 3999 127.0.0.1:6381")))
	require.False(t, redirected(replyErr("ERR something about TRYAGAIN")))
}

// replyErr is an error reply of Redis, as go-redis types them.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

var _ redis.Error = replyErr("")

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
	values, err := encodePlan([]string{"k0", "k1", "k2"}, read, plan)
	require.NoError(t, err)
	require.Equal(t, []uint64{42, 1, 10}, []uint64{a.Rev, b.Rev, c.Rev})
	for i, w := range plan.writes {
		want, err := Marshal(w.job)
		require.NoError(t, err)
		require.Equal(t, want, values[i])
		require.Equal(t, len(values[i]), cap(values[i]))
	}
	_ = append(values[0], 0xff)
	want, err := Marshal(b)
	require.NoError(t, err)
	require.Equal(t, want, values[1])

	bad := &casPlan{writes: []casWrite{{key: "k0", job: a}, {key: "k1", job: &Job{ID: "x"}}}}
	_, err = encodePlan([]string{"k0", "k1", "k2"}, read, bad)
	require.ErrorIs(t, err, ErrInvalid, "a job Marshal refuses is refused")
	_, err = encodePlan([]string{"k0"}, read, &casPlan{writes: []casWrite{{key: "elsewhere", job: a}}})
	require.ErrorContains(t, err, "unwatched")
}
