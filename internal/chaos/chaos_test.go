// Package chaos runs producers and consumers of both queue designs against
// a real redis-server while faults are injected, then checks what is left.
//
//	go test ./internal/chaos                                  # the CI-sized run
//	go test ./internal/chaos -run Chaos -chaos.duration=10m   # the long run
package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/multikey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

var duration = flag.Duration("chaos.duration", 15*time.Second, "how long faults are injected in each design's run")

func TestMain(m *testing.M) {
	redis.SetLogger(quietLog{}) // the restarts make go-redis log every refused dial
	redistest.Main(m)
}

type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...any) {}

// env is a real redis-server with AOF (appendfsync always) behind a fault
// proxy, and the injectors that torment it.
type env struct {
	t      *testing.T
	srv    *redistest.Server
	proxy  *faultproxy.Proxy
	admin  *redis.Client // straight to the server, never faulted
	faults sync.Map      // kind -> *atomic.Int64
}

func newEnv(t *testing.T) *env {
	srv := redistest.Start(t, redistest.Options{AOF: true})
	p, err := faultproxy.Start(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return &env{t: t, srv: srv, proxy: p, admin: redistest.ClientFor(t, srv.URL(), nil)}
}

// client connects through the proxy with short timeouts, as a service
// would configure it.
func (e *env) client() *redis.Client {
	return redistest.ClientFor(e.t, "redis://"+e.proxy.Addr, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = time.Second, time.Second, time.Second
		o.PoolSize = 32
	})
}

func (e *env) count(kind string) {
	v, _ := e.faults.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (e *env) counts() map[string]int64 {
	out := map[string]int64{}
	e.faults.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	c := e.proxy.Counts()
	out["connection reset mid-stream"] += c.Resets
	out["EXEC sent, reply lost"] += c.ExecCuts
	return out
}

// inject runs the fault schedule until ctx ends: random resets and lost
// EXEC replies all along, and at random moments added latency, CLIENT KILL
// of every client from outside, a proxy-wide kill, and (once) a restart of
// redis-server with AOF.
func (e *env) inject(ctx context.Context) {
	base := faultproxy.Faults{ResetProb: 0.002, ExecCutProb: 0.01}
	e.proxy.Set(base)
	restarted := false
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			e.proxy.Set(faultproxy.Faults{})
			return
		case <-tick.C:
		}
		switch r := rand.N(100); {
		case r < 8:
			e.proxy.Set(faultproxy.Faults{ResetProb: base.ResetProb, ExecCutProb: base.ExecCutProb, Latency: 20 * time.Millisecond})
			e.count("latency burst (20 ms per chunk, 250 ms)")
			time.Sleep(250 * time.Millisecond)
			e.proxy.Set(base)
		case r < 14:
			if err := e.admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err == nil {
				e.count("CLIENT KILL of every client")
			}
		case r < 20:
			e.proxy.KillAll()
			e.count("every connection reset")
		case !restarted && time.Since(start) > *duration/2:
			restarted = true
			e.srv.Restart(e.t) // SHUTDOWN (AOF fsynced), then start on the same port
			e.count("redis-server restart (AOF)")
		}
	}
}

// acked tracks enqueues the producer saw succeed.
type acked struct {
	mu        sync.Mutex
	ids       []string
	ambiguous atomic.Int64 // enqueue calls that errored and were retried with the same ID
}

func (a *acked) add(id string) { a.mu.Lock(); a.ids = append(a.ids, id); a.mu.Unlock() }

type result struct {
	enqueued, finished                         int
	lost, finishedTwice, hintMismatches, stuck int
	ambiguous, abandoned                       int64
	faults                                     map[string]int64
}

func (r result) String() string {
	return fmt.Sprintf("enqueued %d, finished %d; lost %d, finished twice %d, hint mismatches %d, stuck %d; "+
		"ambiguous enqueues retried %d, claims abandoned by dying workers %d; faults %v",
		r.enqueued, r.finished, r.lost, r.finishedTwice, r.hintMismatches, r.stuck, r.ambiguous, r.abandoned, r.faults)
}

func TestChaosJobkey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := &jobkey.Config{Prefix: redistest.Prefix(t), Lease: time.Second}
	newQueue := func() *jobkey.Queue {
		q, err := jobkey.NewQueue(e.client(), "chaos", cfg)
		require.NoError(t, err)
		return q
	}

	var ack acked
	var successes sync.Map // job ID -> *atomic.Int64 of recorded successful completions
	onRecorded := func(j *jobkey.Job, err error) {
		if err == nil && j.State == jobkey.StateSucceeded {
			v, _ := successes.LoadOrStore(j.ID, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	handler := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		select { // a little work, long enough for faults to land mid-job
		case <-time.After(time.Duration(rand.N(3)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte(fmt.Sprintf("attempt %d by %s", j.Attempt, j.LeaseOwner)), nil
	})

	chaosCtx, stopChaos := context.WithTimeout(ctx, *duration)
	defer stopChaos()
	workCtx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Two Work consumers, each with its own connections.
	for w := range 2 {
		q := newQueue()
		wg.Go(func() {
			_ = q.Work(workCtx, handler, &jobkey.WorkOpts{Name: fmt.Sprintf("work%d", w), Concurrency: 4,
				PollInterval: 50 * time.Millisecond, Logger: quiet, OnRecorded: onRecorded})
		})
	}
	// Producers: an enqueue that errors may have landed, so it is retried
	// with the same ID until it is known: success, or ErrJobExists.
	for p := range 3 {
		q := newQueue()
		wg.Go(func() {
			for n := 0; chaosCtx.Err() == nil; n++ {
				id := fmt.Sprintf("p%d-%d", p, n)
				for chaosCtx.Err() == nil {
					_, err := q.Enqueue(ctx, "chaos", []byte(id), &jobkey.EnqueueOpts{ID: id})
					if err == nil || errors.Is(err, jobkey.ErrJobExists) {
						ack.add(id)
						break
					}
					ack.ambiguous.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	// A worker that dies mid-job: it claims and is never heard from again.
	var abandoned atomic.Int64
	zq := newQueue()
	wg.Go(func() {
		for chaosCtx.Err() == nil {
			if _, err := zq.Claim(ctx, "dies-mid-job"); err == nil {
				abandoned.Add(1)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	e.inject(chaosCtx)

	// Faults are off. The Work consumers drain what is left; abandoned
	// leases expire and are reclaimed.
	check := newQueue()
	deadline := time.Now().Add(90 * time.Second)
	for {
		st, err := check.Stats(ctx)
		if err == nil && st.Pending+st.Active == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("not drained after 90 s: %+v (%v)", st, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopWork()
	wg.Wait()

	r := result{enqueued: len(ack.ids), ambiguous: ack.ambiguous.Load(), abandoned: abandoned.Load(), faults: e.counts()}
	for _, id := range ack.ids {
		j, err := check.Get(ctx, id)
		switch {
		case errors.Is(err, jobkey.ErrNotFound):
			r.lost++
		case err != nil:
			t.Fatalf("get %s: %v", id, err)
		case j.State == jobkey.StateSucceeded:
			r.finished++
		default:
			r.stuck++
		}
	}
	successes.Range(func(_, v any) bool {
		if v.(*atomic.Int64).Load() > 1 {
			r.finishedTwice++
		}
		return true
	})
	rep, err := check.Verify(ctx, false)
	require.NoError(t, err)
	r.hintMismatches = len(rep.Findings)
	t.Logf("jobkey: %v", r)
	for _, f := range rep.Findings {
		t.Logf("finding: %+v", f)
	}

	require.Positive(t, r.enqueued)
	require.Positive(t, r.faults["EXEC sent, reply lost"]+r.faults["connection reset mid-stream"], "faults were injected")
	require.Zero(t, r.lost, "lost jobs")
	require.Zero(t, r.finishedTwice, "jobs finished twice")
	require.Zero(t, r.hintMismatches, "index entries that disagree with their value")
	require.Zero(t, r.stuck, "jobs a fresh consumer could not drain")
	require.Equal(t, r.enqueued, r.finished)
}

// The same harness against the multi-key design reports the partial states
// it leaves before its sweep runs. They are expected: that is the design.
func TestChaosMultikey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	newQueue := func() *multikey.Queue {
		q := multikey.New(e.client(), prefix, "chaos")
		q.Lease = time.Second
		return q
	}
	var enqueued, retried, finished, abandoned atomic.Int64
	chaosCtx, stopChaos := context.WithTimeout(ctx, *duration)
	defer stopChaos()
	var wg sync.WaitGroup
	for p := range 3 {
		q := newQueue()
		wg.Go(func() {
			for n := 0; chaosCtx.Err() == nil; n++ {
				id := fmt.Sprintf("p%d-%d", p, n)
				for chaosCtx.Err() == nil {
					if _, err := q.Enqueue(ctx, id, []byte(id)); err == nil {
						enqueued.Add(1)
						break
					}
					retried.Add(1) // the same ID again: the design has no way to know
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	for c := range 8 {
		q := newQueue()
		wg.Go(func() {
			for chaosCtx.Err() == nil {
				j, err := q.Claim(ctx, fmt.Sprintf("c%d", c))
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if c == 0 && rand.N(10) == 0 {
					abandoned.Add(1) // dies mid-job
					continue
				}
				if q.Complete(ctx, j, nil) == nil {
					finished.Add(1)
				}
			}
		})
	}
	e.inject(chaosCtx)
	wg.Wait()

	p, err := multikey.New(e.admin, prefix, "chaos").Inspect(ctx)
	require.NoError(t, err)
	t.Logf("multikey: enqueued %d (retried %d), finished %d, abandoned %d; before the sweep: "+
		"orphan records %d, count drift %d, active without lease %d, expired leases %d, IDs listed twice %d, of %d records; faults %v",
		enqueued.Load(), retried.Load(), finished.Load(), abandoned.Load(),
		p.Orphans, p.CountDrift, p.ActiveWithoutLease, p.ExpiredLeases, p.Duplicates, p.Records, e.counts())
	require.Positive(t, enqueued.Load())
}

// An enqueue whose EXEC ran but whose reply was lost returns an error; the
// retry with the same caller ID finds the job and writes nothing. A claim
// whose reply was lost leaves a leased job that is reclaimed after its
// lease; a Complete whose reply was lost is retried and treated as done.
func TestLostRepliesAreSafeToRetry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	q, err := jobkey.NewQueue(e.client(), "lost", &jobkey.Config{Prefix: redistest.Prefix(t), Lease: 300 * time.Millisecond,
		DisableGroupCommit: true})
	require.NoError(t, err)
	cut := func() { e.proxy.Set(faultproxy.Faults{ExecCutProb: 1}) }
	calm := func() { e.proxy.Set(faultproxy.Faults{}) }

	cut()
	_, err = q.Enqueue(ctx, "t", []byte("once"), &jobkey.EnqueueOpts{ID: "a"})
	calm()
	require.Error(t, err, "the reply was lost")
	j, err := q.Enqueue(ctx, "t", []byte("twice?"), &jobkey.EnqueueOpts{ID: "a"})
	require.ErrorIs(t, err, jobkey.ErrJobExists, "the first EXEC had landed")
	require.Equal(t, []byte("once"), j.Payload)

	cut()
	_, err = q.Claim(ctx, "lost-claim")
	calm()
	require.Error(t, err)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Active, "the claim landed although its caller never heard")
	time.Sleep(400 * time.Millisecond)
	c, err := q.Claim(ctx, "second")
	require.NoError(t, err, "reclaimed after the lease")
	require.Equal(t, 2, c.Attempt)

	cut()
	_, err = q.Complete(ctx, c, []byte("r"))
	calm()
	require.Error(t, err)
	done, err := q.Complete(ctx, c, []byte("r"))
	require.NoError(t, err, "the retried Complete sees its own completion")
	require.Equal(t, jobkey.StateSucceeded, done.State)
	rep, err := q.Verify(ctx, false)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	require.Positive(t, e.proxy.Counts().ExecCuts)
}
