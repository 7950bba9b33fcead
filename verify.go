package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Finding is one disagreement between a job's value and the indexes.
type Finding struct {
	ID     string // the job ID (a batch's ID for the batch kinds)
	Kind   string // "missing-entry", "wrong-entry", "stray-entry"; "batch-counts", "batch-unreadable" (batchverify.go)
	Detail string // what was found against what the value says
	Fixed  bool   // set by Verify with Fix, when the repair was written
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	Jobs     int // job values read
	Entries  int // index entries read
	Newer    int // values in a newer major format: not this build's to judge
	Batches  int // batch values read (batchverify.go)
	Findings []Finding
}

// VerifyOpts configure Verify. A nil *VerifyOpts means all defaults.
type VerifyOpts struct {
	// Fix repairs each finding with a compare-and-set under the job key's
	// WATCH that re-derives the job's index entries from its value as it
	// is then. Values are never written (default: false, report only).
	Fix bool
	// Keys also scans the keyspace for job values that no index lists.
	// The other checks walk the queue's indexes, at a cost that grows with
	// the queue; this one must walk the whole database with SCAN, at a
	// cost that grows with every key in it (default: false).
	Keys bool
}

// allIndexes lists every index a shard keeps.
var allIndexes = append(slices.Clone(readyIndexes), idxLeased, idxSucceeded, idxFailed, idxCanceled, idxCorrupt)

// verifyPage is how many entries or keys Verify reads per command: a few
// milliseconds of Redis's time at most, whatever the queue's size. Values
// are read fewer at a time (valuePage, recheckBatch), since each may be as
// large as Config.MaxValueBytes.
const (
	verifyPage   = 1000
	valuePage    = 50
	recheckBatch = 20
)

// Verify walks the queue's indexes and reports every disagreement between
// job values and index entries. Normal operation never needs it: every
// transaction writes a job's entry with its value. It is for keys changed
// outside jobkey.
//
// It reads in pages of at most a thousand, holding one page at a time, and
// it is safe on a busy queue: what looks wrong is read again as one
// consistent snapshot (a read-only MULTI/EXEC of the value and every index
// entry of the job) and reported only if it still disagrees.
//
// Entries of finished jobs whose keys have expired are not findings while
// they are older than the retention: they are trimmed later. Values in a
// newer major format are counted (Newer), not judged. When some shards
// cannot be read (their cluster node is down), the report covers the
// others, and the error is a *ShardsError naming the missing shards.
func (q *Queue) Verify(ctx context.Context, opts *VerifyOpts) (VerifyReport, error) {
	var o VerifyOpts
	if opts != nil {
		o = *opts
	}
	var rep VerifyReport
	if err := q.check(ctx, false); err != nil {
		return rep, err
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return rep, err
	}
	missing := &ShardsError{Of: q.ks.shards}
	for s := range q.ks.shards {
		if err := q.verifyShard(ctx, s, o, now, &rep); err != nil {
			if ctx.Err() != nil {
				return rep, err
			}
			missing.add(s, err)
		}
	}
	return rep, missing.orNil()
}

type placed struct {
	index string
	score int64
}

// scanNode returns the client of the master that owns a shard's hash slot, for
// SCAN, the one command a cluster client does not route by key. The map of
// hash slots go-redis holds may be stale after a hash slot moved, and SCAN on the old
// owner finds nothing, so ownership is confirmed by a keyed command the
// node would answer with MOVED.
func (q *Queue) scanNode(ctx context.Context, shard int) (redis.Cmdable, error) {
	c, ok := q.rdb.(*redis.ClusterClient)
	if !ok {
		return q.rdb, nil
	}
	key := q.ks.index(shard, idxReady)
	for try := 0; ; try++ {
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("jobkey: find node for %s: %w", key, err)
		}
		err = n.Type(ctx, key).Err()
		if _, moved := redis.IsMovedError(err); !moved {
			return n, err
		}
		if try == 20 {
			return nil, fmt.Errorf("jobkey: the hash slot of %s keeps moving: %w", key, err)
		}
		c.ReloadState(ctx) // asynchronous: give it a moment
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// verifyShard checks one shard. Keyed reads go through the queue's client,
// which follows a hash slot that moved; only the keyspace scan needs the node.
func (q *Queue) verifyShard(ctx context.Context, shard int, o VerifyOpts, now time.Time, rep *VerifyReport) error {
	suspects := map[string]bool{}
	seen := batchSeen{}
	if err := q.walkIndexes(ctx, q.rdb, shard, now, rep, suspects, seen); err != nil {
		return err
	}
	if o.Keys {
		node, err := q.scanNode(ctx, shard)
		if err != nil {
			return err
		}
		if err := q.walkKeys(ctx, node, shard, suspects); err != nil {
			return err
		}
		if again, err := q.scanNode(ctx, shard); err != nil || again != node {
			return fmt.Errorf("jobkey: verify: shard %d moved to another node during the scan; run Verify again", shard)
		}
	}
	ids := make([]string, 0, len(suspects))
	for id := range suspects {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for start := 0; start < len(ids); start += recheckBatch {
		found, err := q.recheck(ctx, shard, now, ids[start:min(len(ids), start+recheckBatch)])
		if err != nil {
			return err
		}
		for _, f := range found {
			if o.Fix {
				if err := q.rederive(ctx, shard, f.ID); err != nil {
					// Found all the same: reported, not Fixed. A fix the
					// replicas did not confirm (ErrNotReplicated) was
					// written on the master only.
					rep.Findings = append(rep.Findings, f)
					return wrapf(err, "verify: fix of job %q", f.ID)
				}
				f.Fixed = true
			}
			rep.Findings = append(rep.Findings, f)
		}
	}
	return q.verifyBatches(ctx, shard, seen, rep)
}

// walkIndexes reads every index of a shard a page at a time, with the
// values its entries point at, and notes the IDs whose entry disagrees.
func (q *Queue) walkIndexes(ctx context.Context, node redis.Cmdable, shard int, now time.Time, rep *VerifyReport, suspects map[string]bool, seen batchSeen) error {
	for _, idx := range allIndexes {
		key := q.ks.index(shard, idx)
		// Pages go by score, from the last score read (with an offset past
		// the entries of that score already read): entries that leave an
		// earlier page meanwhile, as jobs move on a live queue, do not
		// shift later ones out of sight, as pages by rank would.
		from, past := "-inf", int64(0)
		for {
			by := &redis.ZRangeBy{Min: from, Max: "+inf", Offset: past, Count: verifyPage}
			zs, err := node.ZRangeByScoreWithScores(ctx, key, by).Result()
			if err != nil {
				return fmt.Errorf("jobkey: verify: read %s: %w", key, err)
			}
			ids := make([]string, len(zs))
			for i, z := range zs {
				ids[i], _ = z.Member.(string)
			}
			raws, err := q.values(ctx, node, shard, ids)
			if err != nil {
				return err
			}
			rep.Entries += len(zs)
			for i, z := range zs {
				v := readValue(raws[i], q.ks.jobKey(shard, ids[i]))
				switch {
				case v.missing:
				case v.newer:
					rep.Newer++
					rep.Jobs++
				default:
					rep.Jobs++
					seen.note(v.job)
				}
				if _, bad := q.judge(ids[i], v, []placed{{idx, int64(z.Score)}}, now); bad {
					suspects[ids[i]] = true
				}
			}
			if len(zs) < verifyPage {
				break
			}
			last := zs[len(zs)-1].Score
			same := int64(0)
			for _, z := range zs {
				if z.Score == last {
					same++
				}
			}
			if next := strconv.FormatInt(int64(last), 10); next == from {
				past += same
			} else {
				from, past = next, same
			}
		}
	}
	return nil
}

// walkKeys scans the shard's job keys a page at a time and notes the IDs
// whose value no index lists where it says.
func (q *Queue) walkKeys(ctx context.Context, node redis.Cmdable, shard int, suspects map[string]bool) error {
	prefix := q.ks.jobKey(shard, "")
	iter := node.Scan(ctx, 0, globEscape(prefix)+"*", verifyPage).Iterator()
	var page []string
	flush := func() error {
		raws, err := q.values(ctx, q.rdb, shard, page)
		if err != nil {
			return err
		}
		scores := make([]*redis.FloatCmd, len(page))
		_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range page {
				want := idxCorrupt
				if v := readValue(raws[i], q.ks.jobKey(shard, id)); v.job != nil {
					want = derive(v.job).index
				} else if v.missing || v.newer {
					continue
				}
				scores[i] = p.ZScore(ctx, q.ks.index(shard, want), id)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("jobkey: verify: read entries: %w", err)
		}
		for i, c := range scores {
			if c != nil && errors.Is(c.Err(), redis.Nil) {
				suspects[page[i]] = true
			}
		}
		page = page[:0]
		return nil
	}
	for iter.Next(ctx) {
		page = append(page, strings.TrimPrefix(iter.Val(), prefix))
		if len(page) == verifyPage {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("jobkey: verify: scan %s*: %w", prefix, err)
	}
	return flush()
}

// values reads the values of ids, valuePage per pipeline, so that no
// reply holds more than that many whole values.
func (q *Queue) values(ctx context.Context, node redis.Cmdable, shard int, ids []string) ([]rawRead, error) {
	out := make([]rawRead, 0, len(ids))
	for start := 0; start < len(ids); start += valuePage {
		page := ids[start:min(len(ids), start+valuePage)]
		cmds := make([]*redis.StringCmd, len(page))
		all, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range page {
				cmds[i] = p.Get(ctx, q.ks.jobKey(shard, id))
			}
			return nil
		})
		if err != nil && (reply.Unanswered(all, err) != nil || !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err)) {
			return nil, fmt.Errorf("jobkey: verify: read values: %w", err)
		}
		for i, c := range cmds {
			r := reply.FromGet(c)
			if r.Err != nil && !reply.IsWrongType(r.Err) {
				return nil, fmt.Errorf("jobkey: verify: get %s: %w", q.ks.jobKey(shard, page[i]), r.Err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// rederive rewrites id's index entries from its value, under WATCH of the
// job key, and never writes the value. A value in a newer format is left
// alone: it is not this build's to judge.
func (q *Queue) rederive(ctx context.Context, shard int, id string) error {
	key := q.ks.jobKey(shard, id)
	_, _, err := q.run(ctx, &casTxn{keys: []string{key}, checks: q.checksFor(shard, allIndexes...),
		decide: func(r *casRead) (*casPlan, error) {
			if errors.Is(r.errs[0], ErrUnsupportedFormat) {
				return nil, nil
			}
			var ip indexPlan
			want := ""
			switch {
			case r.errs[0] != nil:
				want = idxCorrupt
				ip.zadd(q.ks.index(shard, idxCorrupt), toMillis(r.now), id)
			case r.jobs[0] != nil:
				e := q.entryOf(r.jobs[0])
				want = e.index
				ip.zadd(q.ks.index(shard, e.index), e.score, id)
				if j := r.jobs[0]; j.State == StatePending && j.Priority > 0 {
					ip.flag(q.ks.index(shard, prioFlag)) // as the move that first put it there did
				}
			}
			for _, idx := range allIndexes {
				if idx != want {
					ip.zrem(q.ks.index(shard, idx), id)
				}
			}
			plan := &casPlan{}
			plan.index(&ip)
			return plan, nil
		}})
	return err
}
