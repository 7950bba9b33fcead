package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Finding is one disagreement between a job's value and the indexes.
type Finding struct {
	ID     string // the job ID
	Kind   string // "missing-entry", "wrong-entry", "stray-entry", "unreadable"
	Detail string // what was found against what the value says
	Fixed  bool   // set by Verify with fix, when the repair was written
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	Jobs     int // job values read
	Entries  int // index entries read
	Findings []Finding
}

// allIndexes lists every index a shard keeps.
var allIndexes = []string{idxReady, idxLeased, idxSucceeded, idxFailed, idxCanceled, idxCorrupt}

// Verify walks the queue's keys and reports every disagreement between job
// values and index entries. Normal operation never needs it: every
// transaction writes a job's entry with its value. It is for keys changed
// outside jobkey. With fix, each finding is repaired by a compare-and-set
// under the job key's WATCH that re-derives the job's index entries from its
// value as it is then; values are never written.
//
// Entries of finished jobs whose keys have expired are not findings while
// they are older than the retention: the next transaction that finishes a
// job of the same state trims them.
func (q *Queue) Verify(ctx context.Context, fix bool) (VerifyReport, error) {
	var rep VerifyReport
	now, err := q.clock.now(ctx, q.rdb)
	if err != nil {
		return rep, err
	}
	for s := range q.ks.shards {
		if err := q.verifyShard(ctx, s, fix, now, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

type placed struct {
	index string
	score int64
}

func (q *Queue) verifyShard(ctx context.Context, shard int, fix bool, now time.Time, rep *VerifyReport) error {
	// Every index entry of the shard.
	entries := map[string][]placed{}
	for _, idx := range allIndexes {
		key := q.ks.index(shard, idx)
		zs, err := q.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			return fmt.Errorf("jobkey: verify: read %s: %w", key, err)
		}
		for _, z := range zs {
			id, _ := z.Member.(string)
			entries[id] = append(entries[id], placed{idx, int64(z.Score)})
			rep.Entries++
		}
	}
	// Every job value of the shard, read in pipelined batches.
	prefix := q.ks.jobKey(shard, "")
	var ids []string
	// A shard's keys share one slot: on a cluster, scan the node that owns it.
	var scanner redis.Cmdable = q.rdb
	if c, ok := q.rdb.(*redis.ClusterClient); ok {
		node, err := c.MasterForKey(ctx, prefix)
		if err != nil {
			return fmt.Errorf("jobkey: verify: find node for %s: %w", prefix, err)
		}
		scanner = node
	}
	iter := scanner.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		ids = append(ids, strings.TrimPrefix(iter.Val(), prefix))
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("jobkey: verify: scan %s*: %w", prefix, err)
	}
	slices.Sort(ids)
	seen := map[string]bool{}
	for start := 0; start < len(ids); start += 500 {
		batch := ids[start:min(len(ids), start+500)]
		cmds := make([]*redis.StringCmd, len(batch))
		got, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range batch {
				cmds[i] = p.Get(ctx, prefix+id)
			}
			return nil
		})
		if err != nil && (unanswered(got, err) != nil || !errors.Is(err, redis.Nil) && !isRedisErr(err)) {
			return fmt.Errorf("jobkey: verify: read values: %w", err)
		}
		for i, id := range batch {
			seen[id] = true
			raw := fromGet(cmds[i])
			if raw.missing { // expired or deleted between SCAN and GET
				continue
			}
			rep.Jobs++
			var want placed
			var j Job
			switch {
			case raw.err != nil && !isWrongType(raw.err):
				return fmt.Errorf("jobkey: verify: get %s: %w", prefix+id, raw.err)
			case raw.err != nil, unmarshalString(raw.s, &j) != nil:
				want = placed{index: idxCorrupt}
			default:
				e := derive(&j)
				want = placed{e.index, e.score}
			}
			if f, bad := judge(id, want, entries[id]); bad {
				rep.Findings = append(rep.Findings, f)
			}
		}
	}
	// Entries whose job has no value.
	cutoff := map[string]int64{}
	for _, st := range []State{StateSucceeded, StateFailed, StateCanceled} {
		cutoff[derive(&Job{State: st}).index] = toMillis(now.Add(-q.retention(st)))
	}
	for id, ps := range entries {
		if seen[id] {
			continue
		}
		for _, p := range ps {
			if c, finished := cutoff[p.index]; finished && p.score < c {
				continue // expired with its key; trimmed later
			}
			rep.Findings = append(rep.Findings, Finding{ID: id, Kind: "stray-entry",
				Detail: fmt.Sprintf("in %s, but there is no job value", p.index)})
			break
		}
	}
	if !fix {
		return nil
	}
	for i := range rep.Findings {
		f := &rep.Findings[i]
		if _, s := q.ks.jobKeyOf(f.ID); s != shard {
			continue
		}
		if err := q.rederive(ctx, shard, f.ID); err != nil {
			return fmt.Errorf("jobkey: verify: fix %q: %w", f.ID, err)
		}
		f.Fixed = true
	}
	return nil
}

// judge compares where a value says its ID belongs with where it is.
func judge(id string, want placed, have []placed) (Finding, bool) {
	switch {
	case len(have) == 0:
		return Finding{ID: id, Kind: "missing-entry", Detail: "in no index, value says " + describe(want)}, true
	case len(have) > 1:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("in %d indexes, value says %s", len(have), describe(want))}, true
	case have[0].index != want.index:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("in %s, value says %s", have[0].index, describe(want))}, true
	case want.index != idxCorrupt && have[0].score != want.score:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("%s score %d, value says %d", want.index, have[0].score, want.score)}, true
	}
	return Finding{}, false
}

func describe(p placed) string {
	if p.index == idxCorrupt {
		return "corrupt (the value cannot be read)"
	}
	return fmt.Sprintf("%s at %d", p.index, p.score)
}

// rederive rewrites id's index entries from its value, under WATCH of the
// job key, and never writes the value.
func (q *Queue) rederive(ctx context.Context, shard int, id string) error {
	key := q.ks.jobKey(shard, id)
	_, _, err := q.cas.run(ctx, &casTxn{keys: []string{key}, checks: q.checksFor(shard, allIndexes...),
		decide: func(r *casRead) (*casPlan, error) {
			var ip indexPlan
			want := ""
			switch {
			case r.errs[0] != nil:
				want = idxCorrupt
				ip.zadd(q.ks.index(shard, idxCorrupt), toMillis(r.now), id)
			case r.jobs[0] != nil:
				e := derive(r.jobs[0])
				want = e.index
				ip.zadd(q.ks.index(shard, e.index), e.score, id)
			}
			for _, idx := range allIndexes {
				if idx != want {
					ip.zrem(q.ks.index(shard, idx), id)
				}
			}
			return &casPlan{steps: ip.steps(), checks: ip.checks}, nil
		}})
	return err
}

// globEscape quotes the characters SCAN MATCH treats as patterns.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}
