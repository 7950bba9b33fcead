package jobkey

import (
	"context"
	"fmt"

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
func (q *Queue) Pause(ctx context.Context) error {
	return q.setPaused(ctx, true)
}

// Resume undoes Pause on every shard and wakes idle workers, in one round
// trip per node. A *ShardsError
// names the shards that could not be written, which stay paused.
func (q *Queue) Resume(ctx context.Context) error {
	return q.setPaused(ctx, false)
}

func (q *Queue) setPaused(ctx context.Context, paused bool) error {
	if err := q.check(ctx, true); err != nil {
		return err
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
	if err := unanswered(cmds, err); err != nil {
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

// resumeHint is the wake-up message Resume publishes: the one a worker that
// found the queue paused listens to.
const resumeHint = "resume"

// shardGuards returns the pause flags of the shards of cands, for a claim's
// compare-and-set to watch, and which of them guards each candidate.
func (q *Queue) shardGuards(cands []candidate) (keys []string, of []int) {
	of = make([]int, len(cands))
	pos := map[int]int{}
	for i, c := range cands {
		k, ok := pos[c.shard]
		if !ok {
			k = len(keys)
			pos[c.shard] = k
			keys = append(keys, q.ks.pauseKey(c.shard))
		}
		of[i] = k
	}
	return keys, of
}

// readPaused adds to a pipeline the reads of the pause flags of shards, and
// returns what says, once it ran, whether shard s is paused. A flag that
// could not be read counts as not paused: the claim's own compare-and-set
// reads it again under WATCH before it takes anything.
func (q *Queue) readPaused(ctx context.Context, p redis.Pipeliner, shards []int) func(s int) bool {
	flags := map[int]*redis.IntCmd{}
	for _, s := range shards {
		if _, ok := flags[s]; !ok {
			flags[s] = p.Exists(ctx, q.ks.pauseKey(s))
		}
	}
	return func(s int) bool {
		c, ok := flags[s]
		return ok && c.Err() == nil && c.Val() > 0
	}
}
