package cas

import (
	"context"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// TypeCheck declares a key a transaction writes besides the keys it
// watches. Its type is read before MULTI; anything but Want or "none"
// refuses the transaction before anything is written.
type TypeCheck struct {
	Key  string
	Want string
}

// Write sets one watched key to a whole new value, or deletes it (Del).
// Every write must target a key the transaction watched and read (Txn.Keys
// or an auxiliary key), or the compare in compare-and-set would not cover
// it.
type Write struct {
	Key   string
	Value []byte
	TTL   time.Duration // > 0: the key expires
	Del   bool
}

// Plan is what a decision asks the engine to apply in one MULTI/EXEC:
// whole values first, then idempotent extra steps (index updates). Checks
// lists every key the steps write, with the type it must have.
type Plan struct {
	Writes []Write
	Steps  [][]any
	Checks []TypeCheck
	// Confirm says the decision answers from a write it recognised as its
	// own (a retried Complete, an Enqueue that found its job): when writes
	// wait for replicas, that write is waited for too, by a round trip
	// that writes a small key of the connection's own and WAITs.
	Confirm bool
	// Results holds, once EXEC answered, every command's reply, for the
	// decisions that depend on what a step found.
	Results []Result
	// keys and boxed are the transaction's keys and the same keys as
	// round trip 1 boxed them for WATCH: the writes take those interface
	// values rather than box each key again.
	keys  []string
	boxed []any
}

// Empty reports a plan that writes nothing.
func (p *Plan) Empty() bool {
	return p == nil || (len(p.Writes) == 0 && len(p.Steps) == 0)
}

// Read is the state a decision sees: the watched keys as read, raw, and
// Redis's clock when they were read.
type Read struct {
	// Values holds one entry per Txn.Keys key: its bytes, Missing, or a
	// WRONGTYPE error for a key of another type. Any other error fails the
	// attempt instead.
	Values []reply.Raw
	Now    time.Time
	// Guarded says, per Txn.Guards key, whether it holds a value.
	Guarded []bool
	// Aux holds the auxiliary keys read under WATCH (Txn.Aux and what
	// Txn.Follow named), raw.
	Aux map[string]reply.Raw
}

// Txn is one optimistic transaction. Decide may run several times, once
// per attempt, each time on freshly read values; it must not keep state
// between runs.
//
// Type checks: the engine checks the type of every key a plan writes before
// EXEC, in the transaction itself: a type read by an earlier call (the
// index read that found a claim's candidates, up to half a second before
// for entries read ahead) proves nothing now. Keys the caller predicts in
// Checks ride in round trip 1; any other key a plan writes costs one extra
// round trip of TYPE commands, still under the WATCH. A caller whose Extra
// reads a key with a command of its type in round trip 1 may leave it out
// of Checks and of its plan's: Extra refuses the transaction when that read
// answers WRONGTYPE.
type Txn struct {
	Route   string // a key whose hash slot picks the node on a cluster (default: the first key)
	Keys    []string
	Checks  []TypeCheck
	NoRetry bool // return a conflict at once instead of retrying (claims move on)
	// Guards are keys watched beside Keys that the decision reads as set
	// (holding a value) or not (Read.Guarded). They ride in round trip 1,
	// all in one MGET, and a guard set before EXEC aborts it.
	Guards []string
	// Decide may return a *NeedKeys: the keys are watched and read as
	// auxiliary keys (one round trip) and Decide runs again on the larger
	// read, at most MaxMoreRounds times per attempt.
	Decide func(r *Read) (*Plan, error)
	// Aux are keys of values the decision reads and may rewrite whole:
	// watched and read (GET) in round trip 1. Follow, when set, names more
	// such keys once Keys are read: one more round trip watches and reads
	// those not read yet, before Decide runs. All must share the hash slot
	// of Keys on a cluster.
	Aux    []string
	Follow func(r *Read) []string
	// Watch are keys watched beside the others in round trip 1 that only
	// Extra's commands read (a caller's keys, of any type: EnqueueTx). All
	// must share the hash slot of Keys on a cluster.
	Watch []string
	// Extra, when set, adds read-only commands to round trip 1 and returns
	// what to do with their replies and the read, before Follow and Decide
	// run. An error it returns refuses the transaction.
	Extra func(ctx context.Context, p redis.Pipeliner) func(r *Read) error
}
