package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// runMainEnv makes the test binary run the command's main instead of the
// tests, so a test sees its exit status and stderr as an operator would.
const runMainEnv = "JOBKEY_TEST_RUN_MAIN"

func init() {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append(os.Args[:1], strings.Fields(os.Getenv(runMainEnv+"_ARGS"))...)
		main()
		os.Exit(0)
	}
}

// fixture is a live queue on the test Redis, under a prefix of its own.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	rdb    *redis.Client
	q      *jobkey.Queue
	url    string
	prefix string
}

// newFixture makes the queue "mail" with the given shard count.
func newFixture(t *testing.T, shards int) *fixture {
	t.Helper()
	return newFixtureWith(t, jobkey.Config{Shards: shards})
}

// newFixtureWith makes the queue "mail" with cfg, under a prefix of its
// own (cfg.Prefix is set).
func newFixtureWith(t *testing.T, cfg jobkey.Config) *fixture {
	t.Helper()
	url := redistest.RequireReal(t).URL
	rdb := redistest.Client(t, nil)
	cfg.Prefix = redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mail", &cfg)
	require.NoError(t, err)
	return &fixture{t: t, ctx: context.Background(), rdb: rdb, q: q, url: url, prefix: cfg.Prefix}
}

// run runs the command cmd on the fixture's queue with args, and returns
// its standard output.
func (f *fixture) run(cmd string, args ...string) (string, error) {
	f.t.Helper()
	var out, errOut bytes.Buffer
	all := append([]string{cmd, "-redis", f.url, "-queue", "mail", "-prefix", f.prefix}, args...)
	err := run(f.ctx, all, &out, &errOut)
	if err != nil {
		require.NotContains(f.t, oneLine(err), "\n", "an error is one line")
	}
	return out.String(), err
}

func (f *fixture) enqueue(typ string, payload []byte) *jobkey.Job {
	f.t.Helper()
	j, err := f.q.Enqueue(f.ctx, typ, payload, &jobkey.EnqueueOpts{MaxAttempts: 1})
	require.NoError(f.t, err)
	return j
}

// claimed enqueues a job and claims it; no other job may be due.
func (f *fixture) claimed(typ string, payload []byte) *jobkey.Job {
	f.t.Helper()
	j := f.enqueue(typ, payload)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(f.t, err)
	require.Equal(f.t, j.ID, c.ID, "only the job just enqueued is due")
	return c
}

// failed makes a job that failed for good with cause; no other job may be
// due.
func (f *fixture) failed(typ string, payload []byte, cause string) *jobkey.Job {
	f.t.Helper()
	j, err := f.q.Fail(f.ctx, f.claimed(typ, payload), errors.New(cause))
	require.NoError(f.t, err)
	require.Equal(f.t, jobkey.StateFailed, j.State)
	return j
}

func (f *fixture) state(id string) jobkey.State {
	f.t.Helper()
	j, err := f.q.Get(f.ctx, id)
	require.NoError(f.t, err)
	return j.State
}

func (f *fixture) stats() jobkey.Stats {
	f.t.Helper()
	st, err := f.q.Stats(f.ctx)
	require.NoError(f.t, err)
	return st
}

// syncBuffer is a bytes.Buffer a command and a test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// secret is the password of the URLs below; it must never be printed.
const secret = "S3cret"

// requireNoSecret fails when secret appears in what a command printed or
// returned.
func requireNoSecret(t *testing.T, what string, err error, outs ...string) {
	t.Helper()
	all := strings.Join(outs, "\n")
	if err != nil {
		all += "\n" + err.Error() + "\n" + oneLine(err)
	}
	require.NotContains(t, all, secret, what)
}

// replicatedFixture is the queue "mail" on the master of a master and one
// replica of its own, with a client of the replica.
type replicatedFixture struct {
	*fixture
	set     *redistest.Replicated
	replica *redis.Client
}

func newReplicatedFixture(t *testing.T) *replicatedFixture {
	t.Helper()
	set := redistest.StartReplicated(t, 1)
	rdb := redistest.ClientFor(t, set.Master.URL(), nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mail", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	return &replicatedFixture{
		fixture: &fixture{t: t, ctx: context.Background(), rdb: rdb, q: q, url: set.Master.URL(), prefix: prefix},
		set:     set, replica: redistest.ClientFor(t, set.Replicas[0].URL(), nil),
	}
}

// freeze stops the replica's process until thaw, or the test's end: the
// master's writes reach it no more, and it confirms none.
func (f *replicatedFixture) freeze() (thaw func()) {
	f.t.Helper()
	s := f.set.Replicas[0]
	require.NoError(f.t, s.Freeze())
	f.t.Cleanup(func() { _ = s.Thaw() })
	var once sync.Once
	return func() {
		once.Do(func() {
			require.NoError(f.t, s.Thaw())
			require.NoError(f.t, f.set.WaitSynced(10*time.Second))
		})
	}
}

// onReplica is job id as the replica holds it; nil when it holds none.
func (f *replicatedFixture) onReplica(id string) *jobkey.Job {
	f.t.Helper()
	b, err := f.replica.Get(f.ctx, f.q.Keys(id).Job).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	require.NoError(f.t, err)
	j := new(jobkey.Job)
	require.NoError(f.t, jobkey.Unmarshal(b, j))
	return j
}
