package cas

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func testEngine(t *testing.T, rdb redis.UniversalClient, attempts int) *Engine {
	t.Helper()
	e, err := New(rdb, Options{Attempts: attempts, BaseBackoff: 200 * time.Microsecond, MaxBackoff: 5 * time.Millisecond,
		Clock: &redisclock.Clock{Local: time.Now}})
	require.NoError(t, err)
	return e
}

// incr is a transaction that adds one to the decimal counter held at key.
func incr(key string) *Txn {
	return &Txn{Keys: []string{key}, Decide: func(r *Read) (*Plan, error) {
		v := r.Values[0]
		if v.Err != nil {
			return nil, v.Err
		}
		n := 0
		if !v.Missing {
			var err error
			if n, err = strconv.Atoi(v.S); err != nil {
				return nil, err
			}
		}
		return &Plan{Writes: []Write{{Key: key, Value: []byte(strconv.Itoa(n + 1))}}}, nil
	}}
}

func writeNothing(key string) *Txn {
	return &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) { return nil, nil }}
}

func TestConcurrentWritersLoseNoUpdate(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
	e := testEngine(t, rdb, 10_000)
	key := redistest.Prefix(t) + ":counter"

	const workers, each = 16, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for range each {
				if _, _, err := e.Run(ctx, incr(key)); err != nil {
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
	require.Equal(t, strconv.Itoa(workers*each), rdb.Get(ctx, key).Val(), "an increment was lost")
	c := e.Counts()
	require.Positive(t, c.Conflicts, "16 writers on one key must have collided")
	require.Equal(t, int64(workers*each)+c.Conflicts, c.Attempts, "each conflict is retried")
}

func TestAnAttemptIsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb, hook := redistest.Counted(t, 1)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":a"
	require.NoError(t, rdb.Ping(ctx).Err()) // dial the one connection outside the count

	// An uncontended write: WATCH+GET (+TYPE), then MULTI..EXEC.
	txn := incr(key)
	txn.Checks = []TypeCheck{{Key: p + ":ready", Want: "zset"}}
	hook.Reset()
	_, _, err := e.Run(ctx, txn)
	require.NoError(t, err)
	require.EqualValues(t, 2, hook.RTT.Load())
	require.EqualValues(t, 2, e.Counts().RoundTrips)
	// watch, time, get, type | multi, set, exec
	require.EqualValues(t, 7, hook.Cmds.Load())
	require.EqualValues(t, 7, e.Counts().Commands)

	// A "write nothing" decision: WATCH+GET, then UNWATCH.
	hook.Reset()
	_, plan, err := e.Run(ctx, writeNothing(key))
	require.NoError(t, err)
	require.Nil(t, plan)
	require.EqualValues(t, 2, hook.RTT.Load())
	require.EqualValues(t, 1, e.Counts().Unwatches)
	require.EqualValues(t, 4, e.Counts().RoundTrips, "engine and hook agree")
}

// Every path that does not reach EXEC must leave the pooled connection
// without a watch. The pool has one connection, so a leftover watch on key
// would abort the unrelated transaction that follows.
func TestEveryPathThatSkipsEXECUnwatches(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb, _ := redistest.Counted(t, 1)
	other := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":w"
	require.NoError(t, other.Set(ctx, key, "0", 0).Err())
	require.NoError(t, other.Set(ctx, p+":str", "x", 0).Err())

	// unrelated runs a MULTI/EXEC on rdb's only pooled connection after key
	// changed. (Client.TxPipelined may use a connection of its own in go-redis
	// v9.23; Client.Watch borrows from the pool, as the engine does.)
	unrelated := func(t *testing.T) error {
		t.Helper()
		require.NoError(t, other.Incr(ctx, key).Err())
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
			_, _, err := e.Run(ctx, writeNothing(key))
			return err
		},
		"decision fails": func() error {
			_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) { return nil, errors.New("no") }})
			require.EqualError(t, err, "no")
			return nil
		},
		"wrong type refused": func() error {
			txn := incr(key)
			txn.Checks = []TypeCheck{{Key: p + ":str", Want: "zset"}}
			_, _, err := e.Run(ctx, txn)
			require.ErrorIs(t, err, ErrWrongType)
			return nil
		},
		"write to an unwatched key refused": func() error {
			_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
				return &Plan{Writes: []Write{{Key: p + ":elsewhere", Value: []byte("x")}}}, nil
			}})
			require.ErrorContains(t, err, "unwatched")
			require.Zero(t, other.Exists(ctx, p+":elsewhere").Val())
			return nil
		},
		"ctx canceled after the read": func() error {
			cctx, cancel := context.WithCancel(ctx)
			_, _, err := e.Run(cctx, &Txn{Keys: []string{key}, Decide: func(r *Read) (*Plan, error) {
				cancel()
				return &Plan{Writes: []Write{{Key: key, Value: []byte("1")}}}, nil
			}})
			require.ErrorIs(t, err, context.Canceled)
			return nil
		},
	}
	for name, run := range paths {
		t.Run(name, func(t *testing.T) {
			before := e.Counts().Unwatches
			require.NoError(t, run())
			require.Equal(t, before+1, e.Counts().Unwatches, "UNWATCH sent")
			require.NoError(t, unrelated(t), "a stale watch aborted an unrelated transaction")
		})
	}
}

func TestAStepThatErrorsInEXECIsReportedWithEveryStep(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":s"
	require.NoError(t, rdb.Set(ctx, p+":pending", "a string, not a set", 0).Err())

	// The pending key is not declared for a type check, so the step reaches
	// EXEC and errors while applying; the steps around it apply.
	_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
		return &Plan{
			Writes: []Write{{Key: key, Value: []byte("v")}},
			Steps:  [][]any{{"sadd", p + ":pending", key}, {"incr", p + ":count"}},
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

func TestEXECAbortAppliesNothing(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	key := redistest.Prefix(t) + ":x"
	_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
		return &Plan{
			Writes: []Write{{Key: key, Value: []byte("v")}},
			Steps:  [][]any{{"zadd", key + ":z"}}, // wrong arity: refused while queued
		}, nil
	}})
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.True(t, se.Aborted)
	require.Contains(t, err.Error(), "EXECABORT")
	require.Zero(t, rdb.Exists(ctx, key).Val(), "nothing applied")
}

func TestAKeyOfTheWrongTypeIsRefusedBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := p + ":t"
	require.NoError(t, rdb.Set(ctx, p+":ready", "oops", 0).Err())
	txn := incr(key)
	txn.Checks = []TypeCheck{{Key: p + ":ready", Want: "zset"}}
	_, _, err := e.Run(ctx, txn)
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, p+":ready", wt.Key)
	require.Equal(t, "string", wt.Got)
	require.Zero(t, rdb.Exists(ctx, key).Val(), "nothing written")

	// A plan's late check (a key nobody predicted) is refused the same way.
	_, _, err = e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(*Read) (*Plan, error) {
		return &Plan{Writes: []Write{{Key: key, Value: []byte("v")}}, Steps: [][]any{{"zadd", p + ":ready", 1, "m"}},
			Checks: []TypeCheck{{Key: p + ":ready", Want: "zset"}}}, nil
	}})
	require.ErrorAs(t, err, &wt)
	require.Zero(t, rdb.Exists(ctx, key).Val(), "nothing written")

	// A watched key holding another type reaches the decision as
	// WRONGTYPE, for the caller to report.
	require.NoError(t, rdb.LPush(ctx, key, "x").Err())
	read, _, err := e.Run(ctx, writeNothing(key))
	require.NoError(t, err)
	require.ErrorContains(t, read.Values[0].Err, "WRONGTYPE")
	// Several keys read at once (MGET) name the culprit the same way.
	read, _, err = e.Run(ctx, &Txn{Keys: []string{p + ":none", key}, Decide: func(*Read) (*Plan, error) { return nil, nil }})
	require.NoError(t, err)
	require.True(t, read.Values[0].Missing)
	require.ErrorContains(t, read.Values[1].Err, "WRONGTYPE")
}

func TestRivalWritesOnEveryAttemptEndInAConflict(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	other := redistest.Client(t, nil)
	e := testEngine(t, rdb, 4)
	key := redistest.Prefix(t) + ":c"
	n := 0
	_, _, err := e.Run(ctx, &Txn{Keys: []string{key}, Decide: func(r *Read) (*Plan, error) {
		n++
		require.NoError(t, other.Set(ctx, key, "rival "+strconv.Itoa(n), 0).Err()) // a rival write every time
		return &Plan{Writes: []Write{{Key: key, Value: []byte("mine")}}}, nil
	}})
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, ErrConflict)
	require.Equal(t, 4, ce.Attempts)
	require.Contains(t, err.Error(), "4 attempts")
	require.Equal(t, "rival 4", other.Get(ctx, key).Val(), "the losing write never landed")
}
