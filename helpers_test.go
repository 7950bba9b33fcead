package jobkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// This file holds the helpers that the root package's tests share: the
// test server, the fixture and its fake clock, Redis hooks, and the start
// and watch of a Work.

func TestMain(m *testing.M) {
	// A value's buffer read after it went back to the pool reads as
	// garbage in every test (cas.go's encodeBufs).
	poisonEncoded.Store(true)
	redistest.Main(m)
}

// hooked returns a client of the shared test server with a round-trip hook.
func hooked(t *testing.T, poolSize int) (*redis.Client, *rttcount.Hook) {
	t.Helper()
	return redistest.Counted(t, poolSize)
}

// pipeHook runs before every pipeline (and MULTI/EXEC) a client sends: a
// test slows or fails chosen ones with it. Returning an error sends nothing.
type pipeHook func(ctx context.Context, cmds []redis.Cmder) error

func (h pipeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h(ctx, cmds); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// reads reports a pipeline that carries a transaction's round trip 1 (a
// WATCH): a round trip of its own, or one that rides behind the EXEC of the
// batch before it (internal/cas/handover.go).
func reads(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if c.Name() == "watch" {
			return true
		}
	}
	return false
}

// names returns "cmd key" for each command of a pipeline, for matching.
func names(cmds []redis.Cmder) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.Name()
		if a := c.Args(); len(a) > 1 {
			out[i] += " " + fmt.Sprint(a[1])
		}
	}
	return out
}

// has reports whether a pipeline holds a command whose "cmd key" starts
// with cmd and ends with keySuffix.
func has(cmds []redis.Cmder, cmd, keySuffix string) bool {
	for _, n := range names(cmds) {
		if strings.HasPrefix(n, cmd+" ") && strings.HasSuffix(n, keySuffix) {
			return true
		}
	}
	return false
}

// sleepCtxOr waits d or until ctx ends, as a slow network would.
func sleepCtxOr(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// getHook delays the reply of chosen single commands (not pipelines).
type getHook func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

func (h getHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h getHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h(ctx, cmd, next) }
}

func (h getHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// quietLog drops jobkey's log lines.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newerMajorValue returns a stored value in format major version 2.
func newerMajorValue(t *testing.T) []byte {
	t.Helper()
	golden, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	b := bytes.Clone(golden)
	b[3] = 2 // format major version 2
	return b
}

// plantNewer stores a newer-major value under id with a ready entry due at score ms.
func plantNewer(t *testing.T, ctx context.Context, rdb redis.Cmdable, q *Queue, id string, score int64, b []byte) {
	t.Helper()
	keys := q.Keys(id)
	require.NoError(t, rdb.Set(ctx, keys.Job, b, 0).Err())
	require.NoError(t, rdb.ZAdd(ctx, keys.Ready, redis.Z{Score: float64(score), Member: id}).Err())
}

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
	q.clock.Fake = clock.Now // Redis's clock, as far as the queue can tell
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
	for _, idx := range append(slices.Clone(readyIndexes), idxLeased, idxSucceeded, idxFailed, idxCanceled) {
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
	want := f.q.entryOf(got)
	require.Equal(t, want.index, idx, "index of %s (%s)", j.ID, got.State)
	require.Equal(t, want.score, score, "score of %s", j.ID)
}

// realQueue is a queue on the real clock, for Work tests.
func realQueue(t *testing.T, cfg *Config) *Queue {
	t.Helper()
	redistest.RequireReal(t)
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = redistest.Prefix(t)
	q, err := NewQueue(redistest.Client(t, nil), "q", &c)
	require.NoError(t, err)
	return q
}

var quiet = quietLog()

// startWork runs q.Work in the background; the returned stop ends it and
// waits for it to return.
func startWork(t *testing.T, q *Queue, h Handler, opts *WorkOpts) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if opts == nil {
		opts = &WorkOpts{}
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	go func() { done <- q.Work(ctx, h, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("Work did not return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func state(t *testing.T, q *Queue, id string) State {
	t.Helper()
	j, err := q.Get(context.Background(), id)
	require.NoError(t, err)
	return j.State
}

// queueOn returns a queue named "q" under prefix on rdb.
func queueOn(t *testing.T, rdb redis.UniversalClient, prefix string, cfg Config) *Queue {
	t.Helper()
	cfg.Prefix = prefix
	q, err := NewQueue(rdb, "q", &cfg)
	require.NoError(t, err)
	return q
}

// proxied returns a client of the shared real Redis through a fault proxy.
// A reply the proxy drops shows as a read timeout of 200 ms.
func proxied(t *testing.T) (*redis.Client, *faultproxy.Proxy) {
	t.Helper()
	return proxiedWithin(t, 200*time.Millisecond)
}

// lostRepliesPair returns two Queues on one fresh prefix named for name,
// with events on: q through a fault proxy (timeouts 200 ms), and direct
// on the server itself, to set up and to check with. Faults start off.
func lostRepliesPair(t *testing.T, name string) (q, direct *Queue, proxy *faultproxy.Proxy) {
	t.Helper()
	cut, proxy := proxied(t)
	prefix := fmt.Sprint(name, "-", rand.Int64())
	cfg := Config{Shards: 2, Lease: 2 * time.Second, Backoff: func(int) time.Duration { return 0 }, Logger: quietLog()}
	q = queueOn(t, cut, prefix, cfg)
	direct = queueOn(t, redistest.Client(t, nil), prefix, cfg)
	require.NoError(t, direct.EnableEvents(context.Background()))
	return q, direct, proxy
}

// proxiedWithin is proxied with the client's timeouts at d: a test that
// cuts few replies and must not take a slow one for a cut, on a loaded
// machine, waits longer for each.
func proxiedWithin(t *testing.T, d time.Duration) (*redis.Client, *faultproxy.Proxy) {
	t.Helper()
	target := redistest.RequireReal(t)
	o, err := redis.ParseURL(target.URL)
	require.NoError(t, err)
	p, err := faultproxy.Start(o.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return redistest.ClientFor(t, "redis://"+p.Addr, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = d, d, d
	}), p
}

// idOnShard returns an ID with the given prefix that q places on shard s.
func idOnShard(q *Queue, prefix string, s int) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if q.ks.shardOf(id) == s {
			return id
		}
	}
}

// runLog records the jobs a handler ran, in order.
type runLog struct {
	mu   sync.Mutex
	jobs []*Job
}

func (l *runLog) add(j *Job) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, j)
	return len(l.jobs)
}

func (l *runLog) snapshot() []*Job {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Job(nil), l.jobs...)
}

func waitRuns(t *testing.T, l *runLog, n int) []*Job {
	t.Helper()
	require.Eventually(t, func() bool { return len(l.snapshot()) >= n }, 10*time.Second, 5*time.Millisecond)
	return l.snapshot()
}

// otherProcess returns a second process on f's queue, sharing its clock.
func (f *fixture) otherProcess(t *testing.T, cfg Config) *Queue {
	t.Helper()
	cfg.Prefix = f.q.cfg.Prefix
	q, err := NewQueue(redistest.Client(t, nil), "q", &cfg)
	require.NoError(t, err)
	q.clock.Fake = f.clock.Now
	return q
}

// twin returns another process's Queue on f's client and configuration,
// on the clock f.q runs on (the fake one, unless the test turned it off).
func (f *fixture) twin(t *testing.T) *Queue {
	t.Helper()
	q, err := NewQueue(f.rdb, "q", &f.q.cfg)
	require.NoError(t, err)
	q.clock.Fake = f.q.clock.Fake
	return q
}

// verifyClean runs Verify and requires no finding.
func verifyClean(t *testing.T, f *fixture, msg string) {
	t.Helper()
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, msg)
}
