package cas

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Options configure an Engine.
type Options struct {
	Attempts    int           // runs of a transaction before it gives up with a *ConflictError
	BaseBackoff time.Duration // the first retry waits up to this long
	MaxBackoff  time.Duration // no retry waits longer
	Clock       *redisclock.Clock
	// MinReplicas and ReplicaTimeout: every write waits for this many
	// replicas, for this long, in its own round trip (wait.go); 0: no wait.
	MinReplicas    int
	ReplicaTimeout time.Duration
	// SyncKey names the key, in route's hash slot, that a call confirming
	// a write of its own writes before its WAIT (Plan.Confirm). It is
	// needed only with MinReplicas.
	SyncKey func(route string) string
	// Check, when set, runs before every transaction: checks of the server
	// that refuse writes the caller must not make.
	Check func(ctx context.Context) error
	// Failed, when set, is told of every transaction that failed with an
	// error (not a conflict), such as a cluster node that could not be
	// reached.
	Failed func(ctx context.Context, err error)
}

// Engine runs compare-and-set transactions. One attempt is two round
// trips:
//
//  1. WATCH the keys, TIME, GET them and TYPE the declared keys, all in one
//     pipeline on a dedicated connection (read.go);
//  2. MULTI, the whole new values and the extra steps, EXEC (exec.go).
//
// WATCH hygiene: the watch lives on the connection, and the connection goes
// back to the pool afterwards. EXEC clears it whether it commits or aborts;
// every path that does not reach EXEC sends UNWATCH, even when the caller's
// context is done, so a pooled connection never carries a stale watch that
// would abort some later, unrelated transaction.
type Engine struct {
	rdb  redis.UniversalClient
	opts Options
	c    counters
	// readTimeout is the client's ReadTimeout, which bounds the WAIT sent
	// in a pipeline (firstWait).
	readTimeout time.Duration
}

// New returns an engine over rdb, a *redis.Client or a *redis.ClusterClient.
func New(rdb redis.UniversalClient, opts Options) (*Engine, error) {
	var rt time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		rt = c.Options().ReadTimeout
	case *redis.ClusterClient:
		rt = c.Options().ReadTimeout
	default:
		return nil, fmt.Errorf("unsupported client %T: use *redis.Client or *redis.ClusterClient", rdb)
	}
	if opts.Clock == nil {
		opts.Clock = &redisclock.Clock{}
	}
	return &Engine{rdb: rdb, opts: opts, readTimeout: rt}, nil
}

// Counts is what an engine did since it was made.
type Counts struct {
	Txns       int64 // transactions run
	Attempts   int64 // read+decide passes, including retries
	Conflicts  int64 // EXECs aborted because a watched key changed
	RoundTrips int64 // network round trips made
	Commands   int64 // Redis commands sent, MULTI and EXEC included
	Unwatches  int64 // UNWATCHes sent on paths that did not reach EXEC
	Handovers  int64 // round trips 1 carried behind the EXEC before them (handover.go)
}

type counters struct {
	txns, attempts, conflicts, roundTrips, commands, unwatches, handovers atomic.Int64
}

// Counts returns a copy of the engine's counters.
func (e *Engine) Counts() Counts {
	c := &e.c
	return Counts{Txns: c.txns.Load(), Attempts: c.attempts.Load(), Conflicts: c.conflicts.Load(),
		RoundTrips: c.roundTrips.Load(), Commands: c.commands.Load(), Unwatches: c.unwatches.Load(),
		Handovers: c.handovers.Load()}
}

// Run applies t with bounded, jittered retries. It returns the read and the
// plan of the attempt that committed (or that decided to write nothing).
// A *ReplicationError comes with them: the attempt committed on the
// master, and its replicas did not confirm it in time.
func (e *Engine) Run(ctx context.Context, t *Txn) (*Read, *Plan, error) {
	e.c.txns.Add(1)
	if dup, ok := duplicate(t.Keys); ok {
		// Two decisions about one key in one EXEC would each see the old
		// value, and the second write would silently undo the first.
		return nil, nil, fmt.Errorf("jobkey: internal error: transaction names key %q twice", dup)
	}
	if t.Route == "" && len(t.Keys) == 0 && len(t.Aux) > 0 {
		t.Route = t.Aux[0]
	}
	if t.Route == "" && len(t.Keys) > 0 {
		t.Route = t.Keys[0]
	}
	if e.opts.Check != nil {
		if err := e.opts.Check(ctx); err != nil {
			return nil, nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		read, plan, err := e.attempt(ctx, t)
		var r *retry
		if !errors.As(err, &r) {
			if err != nil && e.opts.Failed != nil {
				e.opts.Failed(ctx, err)
			}
			return read, plan, err
		}
		e.c.conflicts.Add(1)
		if c, ok := e.rdb.(*redis.ClusterClient); ok && r.moved {
			c.ReloadState(ctx) // the hash slot moved: ask the cluster who owns it now
		}
		if t.NoRetry || attempt >= e.opts.Attempts {
			return nil, nil, &ConflictError{Key: t.Route, Attempts: attempt}
		}
		if err := pause(ctx, e.backoff(attempt)); err != nil {
			return nil, nil, fmt.Errorf("jobkey: %s: retry after conflict: %w", t.Route, err)
		}
	}
}

// attempt is one pass: round trip 1 (read.go), decide, round trip 2
// (exec.go), and what came back. Any error it returns means nothing was
// written, except one that says the outcome is unknown and a
// *ReplicationError, which comes with the read and plan of a write that
// committed on the master.
func (e *Engine) attempt(ctx context.Context, t *Txn) (_ *Read, _ *Plan, err error) {
	e.c.attempts.Add(1)
	node, err := e.node(ctx, t.Route)
	if err != nil {
		return nil, nil, err
	}
	// The first read of a flush that took over a busy connection is
	// carried behind the EXEC before it (handover.go); any other reads on
	// its own.
	var conn *redis.Conn
	var read *Read
	rr := e.readRound(t)
	res, offered := e.carried(ctx, node, rr)
	took := offered && res.conn != nil
	if offered && !took {
		rr = e.readRound(t) // the carrying pipeline failed: read afresh
	}
	if took {
		e.c.handovers.Add(1)
		conn = res.conn
		adopt(ctx, node, conn)
	} else {
		conn = get(ctx, node)
	}
	armed := true   // a WATCH may be active on conn
	sick := false   // a command on conn failed: it may not be kept
	handed := false // conn went to the next flush: not ours to touch
	defer func() {
		if handed {
			return
		}
		if armed && !e.unwatch(ctx, conn) {
			sick = true
		}
		put(ctx, node, conn, !sick)
	}()
	if took {
		read, err = rr.parse(ctx, conn, res.cmds, res.err, res.sent, res.recv)
	} else {
		read, err = e.readOn(ctx, conn, rr)
	}
	if err != nil {
		sick = true
		return nil, nil, err
	}
	if t.Follow != nil {
		if err := e.readAux(ctx, conn, read, t.Follow(read)); err != nil {
			sick = true
			return nil, nil, err
		}
	}
	plan, err := e.decide(ctx, conn, t, read)
	if rf, ok := err.(*readFailed); ok {
		sick = true
		return nil, nil, rf.err
	}
	if err == nil && plan != nil && plan.Confirm && plan.Empty() && e.waits() {
		armed = false // confirm's round trip starts with UNWATCH
		healthy, err := e.confirm(ctx, conn, t.Route)
		sick = !healthy
		return read, nil, err
	}
	if err != nil || plan.Empty() {
		return read, nil, err // the deferred UNWATCH releases the watch
	}
	plan.keys, plan.boxed = t.Keys, rr.watch[1:1+len(t.Keys)]
	if err := watched(t, read, plan); err != nil {
		return read, nil, err
	}
	if err := e.checkLate(ctx, conn, lateChecks(t, plan)); err != nil {
		sick = true
		return read, nil, err
	}
	// go-redis would still send the EXEC on a done context; a caller who
	// gave up must not have the write land behind its back.
	if err := ctx.Err(); err != nil {
		return read, nil, err
	}
	var cmds []Result
	var unconfirmed error
	carrying := false // a successor's read went after the EXEC
	if e.waits() {
		cmds, unconfirmed, err = e.execWait(ctx, conn, t.Route, plan)
	} else if h := e.handOut(ctx, node); h != nil {
		// The hand-over may have taken a while: a flush whose callers
		// all gave up meanwhile sends nothing, and its successor reads on
		// its own.
		if err := ctx.Err(); err != nil {
			h.result <- carriedResult{}
			return read, nil, err
		}
		carrying = true
		cmds, handed, err = e.execCarrying(ctx, node, conn, t.Route, plan, h)
	} else {
		cmds, err = e.exec(ctx, conn, t.Route, plan)
	}
	armed, err = classify(t.Route, cmds, err)
	if carrying && !handed {
		// The read behind the EXEC was not answered in full: its WATCH may
		// be armed, and the connection out of step. It is not kept.
		armed, sick = true, true
	}
	if err != nil {
		var r *retry
		sick = sick || !errors.As(err, &r) && !errors.Is(err, ErrStep)
		return nil, nil, err
	}
	var re *ReplicationError
	if errors.As(unconfirmed, &re) && re.Err != nil && !reply.IsRedisErr(re.Err) {
		sick = true // WAIT's reply did not come: the connection may be out of step
	}
	plan.Results = cmds
	return read, plan, unconfirmed
}

// node returns the client of the node that owns route's hash slot.
func (e *Engine) node(ctx context.Context, route string) (*redis.Client, error) {
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

// watched refuses a plan that writes a key the transaction did not watch
// and read: the compare in compare-and-set would not cover it.
func watched(t *Txn, r *Read, plan *Plan) error {
	for _, w := range plan.Writes {
		if _, ok := r.Aux[w.Key]; ok {
			continue
		}
		if !contains(t.Keys, w.Key) {
			return fmt.Errorf("jobkey: internal error: write to unwatched key %q", w.Key)
		}
	}
	return nil
}

func contains(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// retry marks an attempt that wrote nothing and may succeed if run again:
// its EXEC was aborted because a watched key changed (TxFailedErr), or the
// hash slot was moving between cluster nodes (moved).
type retry struct {
	err   error
	moved bool
}

func (r *retry) Error() string { return r.err.Error() }
func (r *retry) Unwrap() error { return r.err }

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
func (e *Engine) backoff(attempt int) time.Duration {
	d := e.opts.MaxBackoff
	if shift := attempt - 1; shift < 30 {
		d = min(d, e.opts.BaseBackoff<<shift)
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
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

// MaxMoreRounds bounds how many times one attempt's decision may ask for
// more keys (NeedKeys): each costs a round trip, so a chain of decisions
// that each name the next key stays bounded.
const MaxMoreRounds = 32

// NeedKeys is what a decision returns when it needs auxiliary keys it has
// not read: the engine watches and reads them (one round trip, still
// before MULTI) and runs the decision again on the larger read. A decision
// that names no key it has not read yet is an internal error.
type NeedKeys struct{ Keys []string }

func (n *NeedKeys) Error() string {
	return fmt.Sprintf("jobkey: internal error: decision needs %d more keys", len(n.Keys))
}

// readFailed marks an error of the reads decide made for a NeedKeys: the
// connection may be out of step.
type readFailed struct{ err error }

func (r *readFailed) Error() string { return r.err.Error() }

// decide runs t.Decide, reading what it asks for more (NeedKeys) and
// running it again, at most MaxMoreRounds times.
func (e *Engine) decide(ctx context.Context, conn *redis.Conn, t *Txn, read *Read) (*Plan, error) {
	for round := 0; ; round++ {
		plan, err := t.Decide(read)
		var need *NeedKeys
		if !errors.As(err, &need) {
			return plan, err
		}
		fresh := false
		for _, k := range need.Keys {
			if _, ok := read.Aux[k]; !ok {
				fresh = true
			}
		}
		if !fresh || round >= MaxMoreRounds {
			return nil, fmt.Errorf("jobkey: internal error: a decision asked for keys it had read, or for more than %d rounds of them", MaxMoreRounds)
		}
		if err := e.readAux(ctx, conn, read, need.Keys); err != nil {
			return nil, &readFailed{err: err}
		}
	}
}
