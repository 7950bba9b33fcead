package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/redis/go-redis/v9"
)

// casLimits bounds the retries of one compare-and-set.
type casLimits struct {
	attempts    int           // runs before giving up with ErrConflict
	baseBackoff time.Duration // first retry waits up to this long
	maxBackoff  time.Duration // no retry waits longer
}

// typeCheck declares a key the transaction writes besides the job keys. Its
// type is read in the WATCH+GET round trip; anything but want or "none"
// refuses the transaction before anything is written.
type typeCheck struct {
	key  string
	want string
}

// casWrite sets one watched job key to a whole new value.
type casWrite struct {
	key string
	job *Job
	ttl time.Duration // > 0: the key expires (retention of finished jobs)
}

// auxWrite sets a watched auxiliary key (casTxn.aux, casTxn.follow) to a
// whole new value, or deletes it when val is nil.
type auxWrite struct {
	key string
	val []byte
	ttl time.Duration // > 0: the key expires (a concurrency value with no limit of its own)
}

// casPlan is what a decision asks the engine to apply in one MULTI/EXEC:
// whole values first, then idempotent extra steps (index updates). checks
// lists every key the steps write, with the type it must have.
type casPlan struct {
	writes []casWrite
	aux    []auxWrite // whole values of watched auxiliary keys
	steps  [][]any
	checks []typeCheck
	// results holds, once EXEC answered, every command's reply, for the
	// decisions that depend on what a step found (vanishedFound).
	results []redis.Cmder
	// confirm says the decision answers from a write it recognised as its
	// own (a retried Complete, an Enqueue that found its job): when writes
	// wait for replicas, that write is waited for too (casEngine.confirm).
	confirm bool
}

func (p *casPlan) empty() bool {
	return p == nil || (len(p.writes) == 0 && len(p.aux) == 0 && len(p.steps) == 0)
}

// casRead is the state the decision sees: one entry per watched key, and
// Redis's clock when they were read.
type casRead struct {
	jobs []*Job  // nil when the key does not exist or could not be read
	errs []error // per key: *CorruptError, ErrUnsupportedFormat, *WrongTypeError
	now  time.Time
	// guarded says, per casTxn.guards key, whether it holds a value.
	guarded []bool
	// aux holds the auxiliary keys read under WATCH (casTxn.aux and what
	// casTxn.follow named), raw: the decision decodes them.
	aux map[string]rawRead
}

// casTxn is one optimistic transaction. decide may run several times, once
// per attempt, each time on freshly read values; it must not keep state
// between runs.
//
// Type checks: the engine checks the type of every key a plan writes before
// EXEC, in the transaction itself: a type read by an earlier call (the
// index read that found a claim's candidates, up to half a second before
// for entries read ahead) proves nothing now. Keys the caller predicts in
// checks ride in the WATCH+GET round trip; any other key a plan writes
// costs one extra round trip of TYPE commands, still under the WATCH. A
// caller whose extra reads a key with a command of its type in round trip
// 1 may leave it out of checks and of its plan's: the extra refuses the
// transaction when that read answers WRONGTYPE (the fused read ahead).
type casTxn struct {
	route   string // a key whose hash slot picks the node on a cluster
	keys    []string
	checks  []typeCheck
	noRetry bool // return a conflict at once instead of retrying (claims move on)
	// guards are keys watched beside the job keys that the decision reads
	// as set (holding a value) or not (casRead.guarded): a shard's pause
	// flag, and the flags a read ahead looks at (shardFlags). They ride in
	// round trip 1, all in one MGET, and a guard set before EXEC aborts
	// it.
	guards []string
	decide func(r *casRead) (*casPlan, error)
	// aux are keys of values other than jobs (a concurrency key's slots)
	// that the decision reads and may rewrite whole: watched and read (GET)
	// in round trip 1. follow, when set, names more such keys once the jobs
	// are read (a claimed job's concurrency key is only known then): one
	// more round trip watches and reads those not read yet, before decide
	// runs. All must share the job keys' hash slot on a cluster.
	aux    []string
	follow func(r *casRead) []string
	// extra, when set, adds read-only commands to round trip 1 (the due
	// entries a fused claim will need next) and returns what to do with
	// their replies and the read, before decide runs. An error it returns
	// refuses the transaction: a key the caller left out of checks because
	// extra's commands type it (a zset read answers WRONGTYPE for another
	// type) and that holds another type.
	extra func(ctx context.Context, p redis.Pipeliner) func(r *casRead) error
}

// casMetrics counts what the engine did, for benchmarks and tests.
type casMetrics struct {
	txns       atomic.Int64 // transactions run
	attempts   atomic.Int64 // read+decide passes, including retries
	conflicts  atomic.Int64 // EXECs aborted because a watched key changed
	roundTrips atomic.Int64 // network round trips the engine made
	commands   atomic.Int64 // Redis commands sent, MULTI and EXEC included
	unwatches  atomic.Int64 // UNWATCHes sent on paths that did not reach EXEC
	rides      atomic.Int64 // reads sent behind the EXEC before them (ride.go)
}

// MetricsSnapshot is a copy of a Queue's counters in this process: the
// CAS engine's, and the stuck handlers of its Works.
type MetricsSnapshot struct {
	Txns       int64 // compare-and-set transactions run
	Attempts   int64 // attempts, including retries after conflicts
	Conflicts  int64 // EXECs aborted because a watched key changed
	RoundTrips int64 // network round trips made by the engine
	Commands   int64 // Redis commands sent, MULTI and EXEC included
	Unwatches  int64 // UNWATCHes sent on paths that did not reach EXEC
	// Rides counts transactions whose round trip 1 rode behind the EXEC
	// of the batch before them, on the same connection: a round trip
	// saved each.
	Rides int64
	// StuckHandlers is how many handlers of this process's Works on the
	// Queue are stuck now: still running WorkOpts.StuckAfter after their
	// contexts ended (a gauge).
	StuckHandlers int64
	// StuckDetected counts the handlers ever reported stuck.
	StuckDetected int64
	// The sizes of the batches that group commit flushed, by call:
	// enqueues, claims, completions, lease extensions and Work's fused
	// complete-and-claim (all zero with Config.DisableGroupCommit).
	EnqueueBatches, ClaimBatches, CompleteBatches, ExtendBatches, FinishBatches BatchSizes
}

func (m *casMetrics) snapshot() MetricsSnapshot {
	return MetricsSnapshot{
		Txns: m.txns.Load(), Attempts: m.attempts.Load(), Conflicts: m.conflicts.Load(),
		RoundTrips: m.roundTrips.Load(), Commands: m.commands.Load(), Unwatches: m.unwatches.Load(),
		Rides: m.rides.Load(),
	}
}

// casEngine runs every write jobkey makes. One attempt is two round trips:
//
//  1. WATCH the job keys, GET them and TYPE the declared index keys, all in
//     one pipeline on a dedicated connection;
//  2. MULTI, the whole new values and the extra steps, EXEC.
//
// WATCH hygiene: the watch lives on the connection, and the connection goes
// back to the pool afterwards. EXEC clears it whether it commits or aborts;
// every path that does not reach EXEC sends UNWATCH, even when the caller's
// context is done, so a pooled connection never carries a stale watch that
// would abort some later, unrelated transaction.
type casEngine struct {
	rdb    redis.UniversalClient
	limits casLimits
	clock  *redisclock.Clock
	m      casMetrics
	// check, when set, runs before every transaction: the Queue's one-time
	// checks of the server, which refuse writes it must not make.
	check func(ctx context.Context) error
	// failed, when set, is told of every transaction that failed with an
	// error (not a conflict): the Queue reloads the slot map when the
	// error says a cluster node could not be reached.
	failed func(ctx context.Context, err error)
	// dur is what a write waits for after its EXEC (Config.MinReplicas);
	// readTimeout is the client's ReadTimeout, which bounds the WAIT sent
	// in a pipeline (firstWait).
	dur         durability
	readTimeout time.Duration
}

func newCASEngine(rdb redis.UniversalClient, limits casLimits, clock *redisclock.Clock) (*casEngine, error) {
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		return nil, fmt.Errorf("%w: unsupported client %T: use *redis.Client or *redis.ClusterClient", ErrInvalid, rdb)
	}
	return &casEngine{rdb: rdb, limits: limits, clock: clock}, nil
}

// node returns the client of the node that owns route's slot.
func (e *casEngine) node(ctx context.Context, route string) (*redis.Client, error) {
	switch c := e.rdb.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, route)
		if err != nil {
			return nil, fmt.Errorf("jobkey: find node for %q: %w", route, err)
		}
		return node, nil
	}
	return nil, fmt.Errorf("jobkey: unsupported client %T", e.rdb)
}

// connCache keeps the dedicated connections of one goroutine's run of
// transactions, such as a group-commit leader flushing batch after batch:
// wrapping a pooled connection anew (Client.Conn) for every attempt costs
// allocations and a trip through go-redis's pool on the hot path. It lives
// no longer than that run, so no connection stays out of the pool while
// the queue is idle. One goroutine uses a cache at a time.
type connCache struct {
	conns map[*redis.Client]*redis.Conn
}

type connCacheKey struct{}

// withConnCache returns ctx carrying a new cache, and the func that
// releases its connections.
func withConnCache(ctx context.Context) (context.Context, func()) {
	c := &connCache{}
	return context.WithValue(ctx, connCacheKey{}, c), func() {
		for _, conn := range c.conns {
			_ = conn.Close()
		}
		c.conns = nil
	}
}

// get returns a dedicated connection to node: the cached one, when ctx
// carries a cache, else a new one.
func (e *casEngine) get(ctx context.Context, node *redis.Client) *redis.Conn {
	c, _ := ctx.Value(connCacheKey{}).(*connCache)
	if c == nil {
		return node.Conn()
	}
	if conn, ok := c.conns[node]; ok {
		return conn
	}
	conn := node.Conn()
	if c.conns == nil {
		c.conns = map[*redis.Client]*redis.Conn{}
	}
	c.conns[node] = conn
	return conn
}

// put gives back a connection: kept in ctx's cache when healthy, closed
// otherwise (or when there is no cache).
func (e *casEngine) put(ctx context.Context, node *redis.Client, conn *redis.Conn, healthy bool) {
	c, _ := ctx.Value(connCacheKey{}).(*connCache)
	if c != nil && healthy && c.conns[node] == conn {
		return
	}
	if c != nil && c.conns[node] == conn {
		delete(c.conns, node)
	}
	_ = conn.Close()
}

// run applies t with bounded, jittered retries. It returns the read and the
// plan of the attempt that committed (or that decided to write nothing).
// A *ReplicationError comes with them: the attempt committed on the
// master, and its replicas did not confirm it in time.
func (e *casEngine) run(ctx context.Context, t *casTxn) (*casRead, *casPlan, error) {
	e.m.txns.Add(1)
	if dup, ok := duplicate(t.keys); ok {
		// Two decisions about one key in one EXEC would each see the old
		// value, and the second write would silently undo the first.
		return nil, nil, fmt.Errorf("jobkey: internal error: transaction names key %q twice", dup)
	}
	if t.route == "" && len(t.keys) == 0 && len(t.aux) > 0 {
		t.route = t.aux[0]
	}
	if t.route == "" && len(t.keys) > 0 {
		t.route = t.keys[0]
	}
	if e.check != nil {
		if err := e.check(ctx); err != nil {
			return nil, nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		read, plan, err := e.attempt(ctx, t)
		var r *retry
		if !errors.As(err, &r) {
			if err != nil && e.failed != nil {
				e.failed(ctx, err)
			}
			return read, plan, err
		}
		e.m.conflicts.Add(1)
		if c, ok := e.rdb.(*redis.ClusterClient); ok && r.moved {
			c.ReloadState(ctx) // the slot moved: ask the cluster who owns it now
		}
		if t.noRetry || attempt >= e.limits.attempts {
			return nil, nil, &ConflictError{Key: t.route, Attempts: attempt}
		}
		if err := sleepCtx(ctx, e.backoff(attempt)); err != nil {
			return nil, nil, fmt.Errorf("jobkey: %s: retry after conflict: %w", t.route, err)
		}
	}
}

// retry marks an attempt that wrote nothing and may succeed if run again:
// its EXEC was aborted because a watched key changed (TxFailedErr), or the
// slot was moving between cluster nodes (moved).
type retry struct {
	err   error
	moved bool
}

func (r *retry) Error() string { return r.err.Error() }
func (r *retry) Unwrap() error { return r.err }

// redirected reports a reply of Redis itself saying that the slot lives, or
// is moving, elsewhere: MOVED, ASK or TRYAGAIN. Only Redis's own error
// replies are looked at, never jobkey's messages, which may quote IDs.
func redirected(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "TRYAGAIN ")
}

// duplicate returns a key that appears twice in keys.
func duplicate(keys []string) (string, bool) {
	if len(keys) < 2 {
		return "", false
	}
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, ok := seen[k]; ok {
			return k, true
		}
		seen[k] = struct{}{}
	}
	return "", false
}

// backoff is "full jitter": uniform in [0, min(max, base·2^(attempt-1))].
func (e *casEngine) backoff(attempt int) time.Duration {
	d := e.limits.maxBackoff
	if shift := attempt - 1; shift < 30 {
		d = min(d, e.limits.baseBackoff<<shift)
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
