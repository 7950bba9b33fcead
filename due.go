package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/readahead"
	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// dueIndex is an index a claim reads due entries from, with the priority
// its candidates rank at.
type dueIndex struct {
	index string
	prio  int
}

// dueIndexes are the indexes due entries come from: the expired leases,
// then the ready index of each priority, highest first. Each is read in
// the same round trip; an empty one costs Redis a lookup.
var dueIndexes = func() []dueIndex {
	out := []dueIndex{{idxLeased, leasedPrio}}
	for p := MaxPriority; p >= 0; p-- {
		out = append(out, dueIndex{readyIndex(p), p})
	}
	return out
}()

// dueIndexesP0 are the indexes due entries come from while the queue has
// never had a job of a priority above 0: the expired leases and ready.
var dueIndexesP0 = []dueIndex{{idxLeased, leasedPrio}, {idxReady, 0}}

// dueIdx returns the indexes a read of due entries takes: every
// priority's once this process has seen the queue use priorities, else
// the two a queue without them has (reads then check the shards' prioFlag
// in the same round trip, and read again at once when one is set).
func (q *Queue) dueIdx() []dueIndex {
	if q.prios.Load() {
		return dueIndexes
	}
	// Now and then every index, whatever the flags say: a job above
	// priority 0 whose shard lost its flag (a key deleted or restored
	// apart) waits at most fullReadEvery, not for ever.
	now := time.Now().UnixNano()
	if last := q.fullRead.Load(); now-last > int64(fullReadEvery) && q.fullRead.CompareAndSwap(last, now) {
		return dueIndexes
	}
	return dueIndexesP0
}

// fullReadEvery is how often a process that has not seen the queue use
// priorities reads every priority's index all the same.
const fullReadEvery = time.Minute

// sawPriorities notes that a read found due entries above priority 0:
// from then on, reads take every priority's index.
func (q *Queue) sawPriorities(cands []candidate) {
	if !q.prios.Load() && slices.ContainsFunc(cands, func(c candidate) bool { return c.Prio > 0 && c.Prio < leasedPrio }) {
		q.prios.Store(true)
	}
}

// flagsOf names the pause flags of shards, and their priority flags while
// this process does not know yet that the queue uses priorities.
func (q *Queue) flagsOf(shards []int) *shardFlags {
	f := &shardFlags{}
	prio := !q.prios.Load()
	for _, s := range shards {
		f.add(q.ks, s, prio)
	}
	return f
}

// sawPrioFlag notes that set, a read of f, found a priority flag set: from
// then on, reads take every priority's index. It reports whether it did.
func (q *Queue) sawPrioFlag(f *shardFlags, set []bool) bool {
	if f.anyPrio(set) {
		q.prios.Store(true)
		return true
	}
	return false
}

// dueCandidatesN reads the first n due entries of each ready index and of
// leased, of every shard, in one round trip per node; on more than
// claimShards shards, of a random few first. Reading them also shows the
// indexes hold sorted sets.
func (q *Queue) dueCandidatesN(ctx context.Context, n int) (dueView, error) {
	if q.ks.shards <= claimShards {
		return q.dueIn(ctx, n, nil)
	}
	// Many shards: look in a random few first, and in all of them only when
	// those few have nothing due, so a claim does not read every shard.
	pick := rand.Perm(q.ks.shards)[:claimShards]
	if v, err := q.dueIn(ctx, n, pick); len(v.Cands) > 0 {
		return v, err
	}
	return q.dueIn(ctx, n, nil)
}

// claimShards is how many shards a claim reads first.
const claimShards = 4

// dueIn reads the due entries of the given shards (nil: all of them),
// less those whose node could not be reached lately (upShards).
func (q *Queue) dueIn(ctx context.Context, n int, shards []int) (dueView, error) {
	return q.dueOf(ctx, n, q.upShards(shards))
}

// dueOf reads the due entries of shards.
func (q *Queue) dueOf(ctx context.Context, n int, shards []int) (dueView, error) {
	if err := q.check(ctx, true); err != nil {
		return dueView{}, err
	}
	sent := time.Now()
	t, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return dueView{}, err
	}
	knew := q.prios.Load()
	idx := q.dueIdx() // once: every shard reads the same indexes
	var pending []*dueRead
	for _, s := range shards {
		for _, d := range idx {
			pending = append(pending, &dueRead{shard: s, index: d.index, prio: d.prio})
		}
	}
	out, full, broken, firstErr, err := q.duePages(ctx, pending, strconv.FormatInt(toMillis(t), 10), n)
	if err != nil {
		return dueView{}, err
	}
	if !knew && q.prios.Load() {
		// The read found that the queue uses priorities, whose indexes it
		// did not read: read again, every priority's (once per process).
		return q.dueOf(ctx, n, shards)
	}
	if len(broken) > 0 {
		out = slices.DeleteFunc(out, func(c candidate) bool { return broken[c.Shard] })
	}
	if len(out) == 0 && firstErr != nil {
		return dueView{}, firstErr
	}
	// A shard that could not be read counts as read: a claim cannot take
	// anything of it either. Those whose node could not be reached are
	// named, for the pool to leave out until a read reaches them.
	var down []int
	for s := range broken {
		if q.down.Has(s) {
			down = append(down, s)
		}
	}
	return dueView{Cands: out, Shards: shards, Down: down, Full: full, At: sent}, nil
}

// upShards returns shards (nil: all of them) less those whose node could
// not be reached a moment ago, or at the last read of them: claims on a
// cluster with a dead master do not wait on its dial timeout (which may
// be seconds of dial retries) every time; a read apart looks at them
// again (probeGone). When every shard is out, all are tried.
func (q *Queue) upShards(shards []int) []int {
	if shards == nil {
		shards = make([]int, q.ks.shards)
		for i := range shards {
			shards[i] = i
		}
	}
	out := func(s int) bool { return q.down.Has(s) || q.pool.IsGone(s) }
	if up := slices.DeleteFunc(slices.Clone(shards), out); len(up) > 0 {
		return up
	}
	return shards
}

// dueRead is the reading of one due index of one shard, page by page.
type dueRead struct {
	shard  int
	index  string
	prio   int
	offset int64
	taken  int
	due    *redis.StringSliceCmd
}

// duePages reads up to n due entries (score at most now) of each index in
// pending, one pipeline per page. It reads past the jobs this build cannot
// read (a newer major format), which stay at the head of their index for
// the workers that can: a wider window, and further pages while a full
// page held too few others.
//
// A shard whose index cannot be read (the wrong type, or its cluster node
// is down) is reported in broken, so the other shards' jobs keep flowing;
// firstErr is the first such error, for the caller to surface when nothing
// else is due. An ID found in two indexes (a stray entry) is a candidate
// once: one transaction must not decide about one job twice. err is a
// pipeline that got no answer.
func (q *Queue) duePages(ctx context.Context, pending []*dueRead, now string, n int) (out []candidate, full int, broken map[int]bool, firstErr, err error) {
	window := int64(n + min(q.newerFormat.Size(), 1000))
	broken = map[int]bool{}
	full = -1 // the highest priority whose read filled its window
	seen := map[string]bool{}
	var paused func(s int) bool
	var flags *shardFlags
	var flagsSet func() []bool
	for page := 0; len(pending) > 0 && page < maxDuePages; page++ {
		cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			if page == 0 {
				// Paused shards are read in the same round trip, and left
				// out: their jobs wait for Resume. So is whether the queue
				// uses priorities, when this process does not know yet.
				var shards []int
				for _, r := range pending {
					if !slices.Contains(shards, r.shard) {
						shards = append(shards, r.shard)
					}
				}
				flags = q.flagsOf(shards)
				flagsSet = q.readFlags(ctx, p, flags)
			}
			for _, r := range pending {
				by := &redis.ZRangeBy{Min: "-inf", Max: now, Offset: r.offset, Count: window}
				r.due = p.ZRangeByScore(ctx, q.ks.index(r.shard, r.index), by)
			}
			return nil
		})
		if err := reply.Unanswered(cmds, err); err != nil {
			return nil, -1, nil, nil, fmt.Errorf("jobkey: read due jobs: %w", err)
		}
		var more []*dueRead
		if page == 0 {
			set := flagsSet()
			paused = func(s int) bool { return flags.paused(set, s) }
			q.paused.Store(!slices.ContainsFunc(pending, func(r *dueRead) bool { return !paused(r.shard) }))
			if q.sawPrioFlag(flags, set) {
				return nil, -1, nil, nil, nil // the caller reads again, every priority
			}
		}
		for _, r := range pending {
			if paused(r.shard) {
				continue
			}
			key := q.ks.index(r.shard, r.index)
			ids, err := r.due.Result()
			switch {
			case reply.IsWrongType(err):
				firstErr = cmp.Or(firstErr, error(&WrongTypeError{Key: key, Want: "zset", Got: "non-zset"}))
				broken[r.shard] = true
				continue
			case err != nil:
				firstErr = cmp.Or(firstErr, fmt.Errorf("jobkey: read %s: %w", key, err))
				broken[r.shard] = true
				if q.unreachable(ctx, err) {
					q.down.Add(r.shard, err)
				}
				continue
			}
			for _, id := range ids {
				if !seen[id] && r.taken < n && !q.newerFormat.Has(id) {
					seen[id] = true
					r.taken++
					out = append(out, candidate{Shard: r.shard, ID: id, Index: r.index, Prio: r.prio})
				}
			}
			switch {
			case r.taken >= n:
				full = max(full, r.prio)
			case int64(len(ids)) == window:
				r.offset += window
				more = append(more, r)
			}
		}
		pending = more
	}
	q.sawPriorities(out)
	return keepTopPriorities(out, full), full, broken, firstErr, nil
}

// keepTopPriorities drops the candidates whose priority is below full, the
// highest priority whose read filled its window on some shard: entries of
// that priority may lie past the window, unread, and must be claimed before
// any lower one, on that shard and the others the claim read.
func keepTopPriorities(cands []candidate, full int) []candidate {
	if full <= 0 {
		return cands
	}
	return slices.DeleteFunc(cands, func(c candidate) bool { return c.Prio < full })
}

// untilDue returns how long until the next job becomes claimable by
// Redis's clock, read in the same round trip: the earliest score in ready
// or leased over all shards, past the jobs of a newer format that this
// build looks past. ok is false when the queue holds none.
func (q *Queue) untilDue(ctx context.Context) (wait time.Duration, ok bool, err error) {
	var cmds []*redis.ZSliceCmd
	var clock *redis.TimeCmd
	var up []int // the shards read, in the order of cmds
	idx := q.dueIdx()
	flags := &shardFlags{}
	flagsSet := func() []bool { return nil }
	sent := q.clock.Local()
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if !q.cluster() {
			// On a cluster TIME would go to a node at random, perhaps one
			// that is down; the compare-and-sets keep the estimate fresh.
			clock = p.Time(ctx)
		}
		for s := range q.ks.shards {
			if q.down.Has(s) {
				continue
			}
			n := int64(min(q.newerFormat.Size(), maxSkip))
			for _, d := range idx {
				cmds = append(cmds, p.ZRangeWithScores(ctx, q.ks.index(s, d.index), 0, n))
			}
			up = append(up, s)
		}
		flags = q.flagsOf(up)
		flagsSet = q.readFlags(ctx, p, flags)
		return nil
	})
	set := flagsSet()
	q.sawPrioFlag(flags, set)
	// A shard that cannot be read (its node is down) is left out: the
	// others still say when to wake. A queue found to use priorities is
	// read whole from the next call on; this one may wake late for a
	// scheduled job of a higher priority, by PollInterval at most.
	if err := reply.Unanswered(all, err); err != nil || ctx.Err() != nil {
		return 0, false, fmt.Errorf("jobkey: read next due time: %w", cmp.Or(err, ctx.Err()))
	}
	now, _ := q.clock.Estimate()
	if clock != nil && clock.Err() == nil {
		now = q.clock.Observe(clock.Val(), sent, q.clock.Local())
	}
	var next time.Time
	q.paused.Store(len(up) > 0 && !slices.ContainsFunc(up, func(s int) bool { return !flags.paused(set, s) }))
	for i, c := range cmds {
		if flags.paused(set, up[i/len(idx)]) {
			continue // waits for Resume, which wakes the workers
		}
		for _, z := range c.Val() {
			if id, _ := z.Member.(string); q.newerFormat.Has(id) {
				continue
			}
			if t := fromMillis(int64(z.Score)); next.IsZero() || t.Before(next) {
				next = t
			}
			break
		}
	}
	if next.IsZero() {
		return 0, false, nil
	}
	return max(0, next.Sub(now)), true, nil
}

// dueView is one read of due entries (readahead.View).
type dueView = readahead.View

// aheadN is how many entries of each due index a read ahead takes: enough
// to get past the head of the queue, which the claims in flight are taking.
const aheadN = 32

// probeGone reads again, apart from the claims, the shards whose node the
// last read could not reach (readahead.Pool.Probe). The read is the
// Queue's, not one Work's: the last Work to return ends it and waits for
// it, so that it outlives no Work.
func (q *Queue) probeGone() {
	q.pool.Probe(func(ctx context.Context, shards []int) (dueView, error) { return q.dueOf(ctx, aheadN, shards) })
}

// downFor is how long claims leave out a shard whose node was unreachable.
const downFor = 2 * time.Second

// maxDuePages bounds the pages one read of due entries takes to look past
// jobs of a newer format.
const maxDuePages = 10

// unreachable reports an error that says a cluster node could not be
// reached (a dial or connection failure), as opposed to a reply, a context
// that ended, or a single Redis (where there is nothing else to try).
func (q *Queue) unreachable(ctx context.Context, err error) bool {
	var ne net.Error
	return q.cluster() && ctx.Err() == nil && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, context.DeadlineExceeded) && errors.As(err, &ne)
}

// skipFor is how long a claimer looks past a newer-format job before it
// looks again (and logs the sighting again); maxSkip bounds how many.
const (
	skipFor = time.Minute
	maxSkip = 10000
)
