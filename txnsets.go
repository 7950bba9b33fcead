package jobkey

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Batches run as several transactions. This file holds the plumbing that
// enqueue, claim and the fenced transitions share: which jobs may share a
// transaction, the keys and type checks of one, and which failures refuse
// a transaction whole.

// eachTxn runs a batch as transactions: run(set) writes the jobs at the
// positions in set, all or none, and failed(set, err) records a set's
// failure on its jobs. Sets come from txnSets. A set refused as a whole
// (nothing of it written) that spans several shards is tried again shard
// by shard, so one broken shard does not refuse the others. After a
// failure that would fail the rest too (the context ended, or the one
// Redis is unreachable; on a cluster, a node that is down fails only its
// own shards), the rest is not tried. id(i) is the ID of the job at i.
//
// Enqueues (failFast) go further on a cluster: a set for a shard whose node
// could not be reached a moment ago fails at once, instead of after a dial
// timeout. Writes about running jobs never do: a renewal or an outcome is
// always tried.
func (q *Queue) eachTxn(ctx context.Context, failFast bool, pos []int, id func(i int) string, run func(set []int) error, failed func(set []int, err error)) {
	todo := q.txnSets(pos, id)
	var stop error
	for len(todo) > 0 {
		set := todo[0]
		todo = todo[1:]
		if stop != nil {
			failed(set, &notTried{stop})
			continue
		}
		// On a cluster a set is one shard. One whose node could not be
		// reached a moment ago fails at once, instead of after a dial
		// timeout: nothing is written, and the caller tries again later.
		shard := q.ks.shardOf(id(set[0]))
		if failFast && q.cluster() && q.down.Has(shard) {
			failed(set, fmt.Errorf("jobkey: not attempted, nothing written: the node of shard %d%s could not be reached within the last %v, "+
				"and the cluster's map of hash slots still names it", shard, q.down.Where(shard), downFor))
			continue
		}
		err := run(set)
		switch {
		case err == nil:
		case refusedWhole(err):
			if parts := q.byShard(set, id); len(parts) > 1 {
				todo = append(parts, todo...)
				continue
			}
			failed(set, err)
		case errors.Is(err, ErrNotReplicated):
			// Applied, not yet confirmed. On one Redis the rest is not
			// tried: it would wait for the same replicas. It is told so
			// without matching ErrNotReplicated, since nothing of it was
			// written.
			failed(set, err)
			if !q.cluster() {
				stop = errors.New(err.Error())
			}
		default:
			failed(set, err)
			switch {
			case !q.cluster() || ctx.Err() != nil:
				stop = err
			case q.unreachable(ctx, err):
				q.down.Add(shard, err)
			}
		}
	}
}

// txnSets splits the positions pos of a batch into the sets one
// transaction may carry: one set per shard on a cluster (a transaction
// must stay in one hash slot there), all together on a single Redis, and
// none longer than Config.MaxBatch.
func (q *Queue) txnSets(pos []int, id func(i int) string) [][]int {
	groups := [][]int{pos}
	if q.cluster() {
		groups = q.byShard(pos, id)
	}
	var out [][]int
	for _, g := range groups {
		for start := 0; start < len(g); start += q.cfg.MaxBatch {
			out = append(out, g[start:min(len(g), start+q.cfg.MaxBatch)])
		}
	}
	return out
}

// byShard groups positions by their job's shard, in order of first use.
func (q *Queue) byShard(pos []int, id func(i int) string) [][]int {
	var groups [][]int
	at := map[int]int{} // shard -> index in groups
	for _, i := range pos {
		s := q.ks.shardOf(id(i))
		g, ok := at[s]
		if !ok {
			g = len(groups)
			at[s] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// cluster reports whether the queue runs on a Redis Cluster.
func (q *Queue) cluster() bool {
	_, ok := q.rdb.(*redis.ClusterClient)
	return ok
}

// txnKeys returns the job keys and shards of the IDs of one transaction,
// and type checks of the predicted indexes of every shard they touch.
func (q *Queue) txnKeys(ids []string, predict ...string) (keys []string, shards []int, checks []typeCheck) {
	keys, shards = make([]string, len(ids)), make([]int, len(ids))
	seen := map[int]bool{}
	for k, id := range ids {
		keys[k], shards[k] = q.ks.jobKeyOf(id)
		if !seen[shards[k]] {
			seen[shards[k]] = true
			checks = append(checks, q.checksFor(shards[k], predict...)...)
		}
	}
	return keys, shards, checks
}

// refusedWhole reports an error that refused a whole transaction before
// EXEC, so nothing of it was written and its jobs may be tried again apart.
func refusedWhole(err error) bool {
	return errors.Is(err, ErrWrongType) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedFormat) ||
		errors.Is(err, ErrTooLarge) || errors.Is(err, ErrConflict)
}

// errLeftOut is the placeholder of a batched call whose caller gave up: it
// was already answered with its context's error, and nothing was written.
var errLeftOut = errors.New("jobkey: left out: the caller gave up")

// notTried marks the jobs of a batch that were not attempted because an
// earlier transaction of the batch failed in a way that would fail them
// too (Redis unreachable, the context ended): nothing was written for them.
type notTried struct{ cause error }

func (e *notTried) Error() string {
	return "jobkey: not attempted, nothing written: an earlier transaction of the batch failed: " + e.cause.Error()
}
func (e *notTried) Unwrap() error { return e.cause }
