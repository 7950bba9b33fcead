package jobkey

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Pause stops Claim and Work from taking jobs of the queue, on every shard,
// until Resume. Jobs already claimed run to their end and record their
// outcome; Enqueue still accepts jobs; Stats reports Paused. It costs one
// round trip per node, and nothing on an unpaused claim: each claim's
// compare-and-set watches and reads its shards' flags in the round trip it
// already makes, so no job is claimed after Pause has returned.
//
// When some shards could not be written (their cluster node is down), the
// others stay paused and a *ShardsError names the rest: run Pause again.
//
// With Config.MinReplicas, each shard's flag is written by a
// compare-and-set of its own that waits for the replicas, as every write
// of a job does (two round trips per shard, the shards at once); a shard
// they did not confirm is named in the *ShardsError, which then matches
// ErrNotReplicated: paused on the master only, so a failover may undo it.
// Pause again to wait again.
func (q *Queue) Pause(ctx context.Context) error {
	return q.setPaused(ctx, true)
}

// Resume undoes Pause on every shard and wakes idle workers, in one round
// trip per node. A *ShardsError names the shards that could not be
// written, which stay paused. With Config.MinReplicas it waits for the
// replicas as Pause does.
func (q *Queue) Resume(ctx context.Context) error {
	return q.setPaused(ctx, false)
}

func (q *Queue) setPaused(ctx context.Context, paused bool) error {
	if err := q.check(ctx, true); err != nil {
		return err
	}
	if q.cfg.MinReplicas > 0 {
		return q.setPausedReplicated(ctx, paused)
	}
	cmds := make([]redis.Cmder, q.ks.shards)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.ks.shards {
			if paused {
				cmds[s] = p.Set(ctx, q.ks.pauseKey(s), "1", 0)
			} else {
				cmds[s] = p.Del(ctx, q.ks.pauseKey(s))
			}
		}
		if !paused {
			// Idle workers wait for a hint or their poll interval; the
			// jobs that waited while paused are due now.
			p.Publish(ctx, q.ks.wakeChannel(), resumeHint)
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return fmt.Errorf("jobkey: pause %q: %w", q.name, err)
	}
	failed := &ShardsError{Of: q.ks.shards, Write: true}
	for s, c := range cmds {
		if err := c.Err(); err != nil {
			failed.add(s, fmt.Errorf("jobkey: write %s: %w", q.ks.pauseKey(s), err))
		}
	}
	return failed.orNil()
}

// setPausedReplicated is setPaused when writes wait for replicas
// (Config.MinReplicas): each shard's flag is a compare-and-set of its own,
// whose EXEC waits for the replicas as every write does; a flag already as
// asked is confirmed as a write of its own. The shards go at once, one
// transaction each. A shard the replicas did not confirm is named in the
// *ShardsError with its *ReplicationError: written on the master only.
func (q *Queue) setPausedReplicated(ctx context.Context, paused bool) error {
	errs := make([]error, q.ks.shards)
	var wg sync.WaitGroup
	for s := range q.ks.shards {
		wg.Go(func() {
			key := q.ks.pauseKey(s)
			_, _, errs[s] = q.run(ctx, &casTxn{aux: []string{key}, decide: func(r *casRead) (*casPlan, error) {
				cur := r.aux[key]
				switch {
				case cur.Err != nil:
					return nil, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
				case paused && !cur.Missing, !paused && cur.Missing:
					return &casPlan{confirm: true}, nil // as asked already, maybe by this caller's last try
				}
				plan := &casPlan{aux: []auxWrite{{key: key}}}
				if paused {
					plan.aux[0].val = []byte("1")
				} else {
					// Idle workers wake: this shard's jobs are due now.
					plan.steps = [][]any{{"publish", q.ks.wakeChannel(), resumeHint}}
				}
				return plan, nil
			}})
		})
	}
	wg.Wait()
	failed := &ShardsError{Of: q.ks.shards, Write: true}
	for s, err := range errs {
		if err != nil {
			failed.add(s, fmt.Errorf("jobkey: write %s: %w", q.ks.pauseKey(s), err))
		}
	}
	return failed.orNil()
}

// resumeHint is the wake-up message Resume publishes: the one a worker that
// found the queue paused listens to.
const resumeHint = "resume"

// shardGuards returns the pause flags of the shards of cands, for a claim's
// compare-and-set to watch, and which of them guards each candidate.
func (q *Queue) shardGuards(cands []candidate) (*shardFlags, []int) {
	f := &shardFlags{}
	of := make([]int, len(cands))
	for i, c := range cands {
		f.add(q.ks, c.Shard, false)
		of[i] = f.at[c.Shard]
	}
	return f, of
}

// shardFlags names the flags of some shards that one command reads (an
// MGET): each shard's pause flag, and its priority flag (prioFlag) where
// asked. A flag is set when it holds a value, as Pause and the EXEC that
// first enqueues a job above priority 0 write one; Resume deletes it.
// Reading both flags of a shard in one command, and every shard's in one
// on a single Redis, spares a command per flag.
type shardFlags struct {
	keys []string
	at   map[int]int // shard -> the position of its pause flag in keys
	prio []int       // positions in keys of the priority flags
}

// add names shard s's pause flag, and its priority flag when prio, unless
// they are named already.
func (f *shardFlags) add(ks *keyspace, s int, prio bool) {
	if f.at == nil {
		f.at = map[int]int{}
	}
	if _, ok := f.at[s]; !ok {
		f.at[s] = len(f.keys)
		f.keys = append(f.keys, ks.pauseKey(s))
	}
	if k := ks.index(s, prioFlag); prio && !slices.Contains(f.keys, k) {
		f.prio = append(f.prio, len(f.keys))
		f.keys = append(f.keys, k)
	}
}

// paused reports whether set, which says per key whether it is set, has
// shard s's pause flag set.
func (f *shardFlags) paused(set []bool, s int) bool {
	i, ok := f.at[s]
	return ok && i < len(set) && set[i]
}

// anyPrio reports whether set has a priority flag set.
func (f *shardFlags) anyPrio(set []bool) bool {
	return slices.ContainsFunc(f.prio, func(i int) bool { return i < len(set) && set[i] })
}

// readFlags adds to a pipeline the read of f's flags: one MGET on a single
// Redis, one per shard on a cluster (a command stays in one hash slot; a
// shard's flags share its tag). It returns what says, once it ran, which
// are set: a flag that could not be read counts as not set (a claim's own
// compare-and-set reads the pause flags again under WATCH before it takes
// anything).
func (q *Queue) readFlags(ctx context.Context, p redis.Pipeliner, f *shardFlags) func() []bool {
	if len(f.keys) == 0 {
		return func() []bool { return nil }
	}
	type part struct {
		from int
		cmd  *redis.SliceCmd
	}
	var parts []part
	if !q.cluster() {
		parts = append(parts, part{0, p.MGet(ctx, f.keys...)})
	} else {
		for from := 0; from < len(f.keys); {
			to := from + 1
			for to < len(f.keys) && hashSlot(f.keys[to]) == hashSlot(f.keys[from]) {
				to++
			}
			parts = append(parts, part{from, p.MGet(ctx, f.keys[from:to]...)})
			from = to
		}
	}
	return func() []bool {
		set := make([]bool, len(f.keys))
		for _, pt := range parts {
			vals, err := pt.cmd.Result()
			if err != nil {
				continue
			}
			for i, v := range vals {
				set[pt.from+i] = v != nil
			}
		}
		return set
	}
}
