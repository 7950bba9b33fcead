package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Verify of batches. A batch's counts are checked against the jobs the
// walk of the indexes found for it (batchSeen):
//
//   - Pending exactly: a job not finished has no expiry, so every one the
//     batch counts is there, or, in a chain, is the one job the batch
//     before it writes when it fires (Batch.After);
//   - Succeeded, Failed and Canceled at least as many as found: a finished
//     job expires by its retention, or is deleted, and stays counted;
//   - the counts add up to Total.
//
// A batch that disagrees is read again as one snapshot (its value, the
// jobs found for it and, in a chain, the batch before it) and reported
// only if it still disagrees: Kind "batch-counts". A job that moved back
// to an index the walk had read (a Retry while Verify ran) is not found;
// such a report goes when Verify runs again. Counts are never rewritten by
// Fix: they are derived from every transition the jobs made, which no
// later read can replay.

// batchSeen is what a walk of a shard's indexes found of batch jobs: each
// job's latest value read, by batch ID.
type batchSeen map[string]map[string]State

func (s batchSeen) note(j *Job) {
	if j == nil || j.Batch == "" {
		return
	}
	if s[j.Batch] == nil {
		s[j.Batch] = map[string]State{}
	}
	s[j.Batch][j.ID] = j.State
}

// batchVerdict says what is wrong with b's counts, given the states of
// the jobs found for it and whether its chain's job is still to be
// written: "" when nothing is.
func batchVerdict(b *Batch, found map[string]State, unwritten bool) string {
	var c [4]int
	for _, s := range found {
		c[bucketIndex(bucket(s))]++
	}
	if unwritten {
		c[0]++
	}
	switch {
	case b.Pending+b.Succeeded+b.Failed+b.Canceled != b.Total:
		return fmt.Sprintf("counts %d pending, %d succeeded, %d failed, %d canceled add up to %d, not its %d jobs",
			b.Pending, b.Succeeded, b.Failed, b.Canceled, b.Pending+b.Succeeded+b.Failed+b.Canceled, b.Total)
	case c[0] != b.Pending:
		return fmt.Sprintf("counts %d pending, but %d of its jobs are pending or active", b.Pending, c[0])
	case c[1] > b.Succeeded, c[2] > b.Failed, c[3] > b.Canceled:
		return fmt.Sprintf("counts %d succeeded, %d failed, %d canceled, fewer than its jobs found: %d, %d, %d",
			b.Succeeded, b.Failed, b.Canceled, c[1], c[2], c[3])
	case b.Pending == 0 && b.Fired == BatchNotFired:
		return "every job has finished, and its callback was never written"
	}
	return ""
}

// bucketIndex is the place of bucket s in [pending, succeeded, failed,
// canceled].
func bucketIndex(s State) int {
	switch s {
	case StateSucceeded:
		return 1
	case StateFailed:
		return 2
	case StateCanceled:
		return 3
	}
	return 0
}

// verifyBatches checks the batches of shard against seen.
func (q *Queue) verifyBatches(ctx context.Context, shard int, seen batchSeen, rep *VerifyReport) error {
	ids, err := q.batchIDs(ctx, shard)
	if err != nil {
		return err
	}
	for start := 0; start < len(ids); start += valuePage {
		page := ids[start:min(len(ids), start+valuePage)]
		keys := make([]string, 0, 2*len(page))
		for _, id := range page {
			keys = append(keys, q.ks.batchKey(shard, id))
		}
		raws, err := q.getRaw(ctx, keys)
		if err != nil {
			return err
		}
		for i, id := range page {
			if raws[i].Missing {
				continue // expired after it fired: its entry is a hint
			}
			rep.Batches++
			b, err := readBatch(keys[i], raws[i])
			if err != nil {
				rep.Findings = append(rep.Findings, Finding{ID: id, Kind: "batch-unreadable", Detail: err.Error()})
				continue
			}
			if batchVerdict(b, seen[id], q.unwrittenGuess(b, seen)) == "" {
				continue
			}
			f, err := q.recheckBatch(ctx, shard, id, seen[id])
			if err != nil {
				return err
			}
			if f != nil {
				rep.Findings = append(rep.Findings, *f)
			}
		}
	}
	return nil
}

// unwrittenGuess says, from the walk, whether b's chain job is still to
// be written: the walk found no job under b.After. The snapshot decides.
func (q *Queue) unwrittenGuess(b *Batch, seen batchSeen) bool {
	if b.After == "" {
		return false
	}
	_, found := seen[b.ID][b.After]
	return !found
}

// recheckBatch reads batch id, the jobs found for it and, in a chain, the
// job and the batch before it, as one snapshot, and returns the finding
// that still holds.
func (q *Queue) recheckBatch(ctx context.Context, shard int, id string, found map[string]State) (*Finding, error) {
	children := make([]string, 0, len(found))
	for c := range found {
		children = append(children, c)
	}
	slices.Sort(children)
	keys := []string{q.ks.batchKey(shard, id)}
	for _, c := range children {
		keys = append(keys, q.ks.jobKey(shard, c))
	}
	for range 3 {
		raws, changed, err := q.cas.Snapshot(ctx, keys, func(redis.Pipeliner) {})
		if err != nil {
			return nil, fmt.Errorf("jobkey: verify: read batch %q: %w", id, err)
		}
		if changed {
			continue
		}
		if raws[0].Missing {
			return nil, nil
		}
		b, err := readBatch(keys[0], raws[0])
		if err != nil {
			return &Finding{ID: id, Kind: "batch-unreadable", Detail: err.Error()}, nil
		}
		now := map[string]State{}
		for i, c := range children {
			if v := readValue(raws[1+i], keys[1+i]); v.job != nil && v.job.Batch == id {
				now[c] = v.job.State
			}
		}
		unwritten := false
		if b.After != "" {
			if _, ok := now[b.After]; !ok {
				unwritten, err = q.chainJobUnwritten(ctx, shard, b.After)
				if err != nil {
					return nil, err
				}
			}
		}
		if why := batchVerdict(b, now, unwritten); why != "" {
			return &Finding{ID: id, Kind: "batch-counts", Detail: "batch " + why}, nil
		}
		return nil, nil
	}
	return nil, nil
}

// chainJobUnwritten says whether the job after writes when it fires is
// still to be written: batch after exists and has not fired, and no job
// holds its ID.
func (q *Queue) chainJobUnwritten(ctx context.Context, shard int, after string) (bool, error) {
	raws, changed, err := q.cas.Snapshot(ctx, []string{q.ks.batchKey(shard, after), q.ks.jobKey(shard, after)}, func(redis.Pipeliner) {})
	if err != nil || changed {
		return false, err
	}
	if raws[0].Missing || !raws[1].Missing {
		return false, nil
	}
	b, err := readBatch(q.ks.batchKey(shard, after), raws[0])
	return err == nil && b.Fired == BatchNotFired, nil
}

// batchIDs reads the IDs of shard's batches index, a page at a time.
func (q *Queue) batchIDs(ctx context.Context, shard int) ([]string, error) {
	key := q.ks.index(shard, idxBatches)
	var out []string
	for start := int64(0); ; start += verifyPage {
		page, err := q.rdb.ZRange(ctx, key, start, start+verifyPage-1).Result()
		if err != nil {
			return nil, fmt.Errorf("jobkey: read %s: %w", key, err)
		}
		out = append(out, page...)
		if len(page) < verifyPage {
			return out, nil
		}
	}
}

// getRaw reads keys, one GET each in one pipeline.
func (q *Queue) getRaw(ctx context.Context, keys []string) ([]rawRead, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && (reply.Unanswered(all, err) != nil || !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err)) {
		return nil, fmt.Errorf("jobkey: read batches: %w", err)
	}
	out := make([]rawRead, len(keys))
	for i, c := range cmds {
		out[i] = reply.FromGet(c)
		if out[i].Err != nil && !reply.IsWrongType(out[i].Err) {
			return nil, fmt.Errorf("jobkey: get %s: %w", keys[i], out[i].Err)
		}
	}
	return out, nil
}
