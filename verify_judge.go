package jobkey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// value is a job value as Verify sees it.
type value struct {
	job     *Job // readable
	missing bool // no key
	newer   bool // a newer major format: not judged
	// otherwise unreadable: it belongs in the corrupt index
}

// readValue reads the value stored at key, a job's key.
func readValue(raw rawRead, key string) value {
	if raw.missing {
		return value{missing: true}
	}
	if raw.err != nil {
		return value{} // another Redis type
	}
	var j Job
	switch err := unmarshalString(raw.s, &j); {
	case err == nil && storedAt(key, &j) == nil:
		return value{job: &j}
	case err == nil:
		return value{} // the value of another job or queue, copied or forged: corrupt
	case errors.Is(err, ErrUnsupportedFormat):
		return value{newer: true}
	}
	return value{}
}

// recheck reads the suspects as one snapshot and returns the findings
// that still hold: WATCH their keys, read the values, then read every
// index's ZSCORE of each in MULTI/EXEC. The EXEC commits only if no value
// changed since it was read, so values and entries are seen as of one
// moment, and no whole value is copied while Redis runs the EXEC. Jobs
// that keep changing are tried three times, then left: a job that moves
// on is no finding.
func (q *Queue) recheck(ctx context.Context, shard int, now time.Time, ids []string) ([]Finding, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = q.ks.jobKey(shard, id)
	}
	for range 3 {
		var out []Finding
		err := q.rdb.Watch(ctx, func(tx *redis.Tx) error {
			gets := make([]*redis.StringCmd, len(ids))
			cmds, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, k := range keys {
					gets[i] = p.Get(ctx, k)
				}
				return nil
			})
			if err != nil && (unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !isRedisErr(err)) {
				return err
			}
			scores := make([][]*redis.FloatCmd, len(ids))
			cmds, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				for i, id := range ids {
					for _, idx := range allIndexes {
						scores[i] = append(scores[i], p.ZScore(ctx, q.ks.index(shard, idx), id))
					}
				}
				return nil
			})
			if errors.Is(err, redis.TxFailedErr) {
				// A job changed since its GET: the scores are no snapshot
				// (every one carries the abort), so nothing may be judged
				// from them. Read again.
				return err
			}
			if err != nil && (unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !isRedisErr(err)) {
				return err
			}
			for i, id := range ids {
				var have []placed
				for k, c := range scores[i] {
					if s, err := c.Result(); err == nil {
						have = append(have, placed{allIndexes[k], int64(s)})
					}
				}
				if f, bad := q.judge(id, readValue(fromGet(gets[i]), keys[i]), have, now); bad {
					out = append(out, f)
				}
			}
			return nil
		}, keys...)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("jobkey: verify: read %d jobs: %w", len(ids), err)
		}
		return out, nil
	}
	return nil, nil
}

// judge compares where a value says its ID belongs with the entries found.
func (q *Queue) judge(id string, v value, have []placed, now time.Time) (Finding, bool) {
	if v.newer {
		return Finding{}, false
	}
	if v.missing {
		for _, p := range have {
			if finishedState(p.index) != 0 {
				// A finished job whose key expired with its retention (the
				// retention of whichever process finished it), its entry
				// not trimmed yet: nothing to judge, and nothing lost.
				continue
			}
			return Finding{ID: id, Kind: "stray-entry", Detail: fmt.Sprintf("in %s, but there is no job value", p.index)}, true
		}
		return Finding{}, false
	}
	want := placed{index: idxCorrupt}
	if v.job != nil {
		e := q.entryOf(v.job)
		want = placed(e)
	}
	switch {
	case len(have) == 0:
		return Finding{ID: id, Kind: "missing-entry", Detail: "in no index, value says " + describe(want)}, true
	case len(have) > 1:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("in %d indexes, value says %s", len(have), describe(want))}, true
	case have[0].index != want.index:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("in %s, value says %s", have[0].index, describe(want))}, true
	case waitingForSlot(v.job, have[0]):
		// A keyed job whose key was full: its entry waits, later than its
		// RunAt, for a slot (concurrencykey.go).
	case want.index != idxCorrupt && have[0].score != want.score:
		return Finding{ID: id, Kind: "wrong-entry", Detail: fmt.Sprintf("%s score %d, value says %d", want.index, have[0].score, want.score)}, true
	}
	return Finding{}, false
}

// waitingForSlot says whether p is the ready entry of j, a pending job of
// a concurrency key, moved later than its RunAt by a claim that found the
// key full.
func waitingForSlot(j *Job, p placed) bool {
	return j != nil && j.ConcurrencyKey != "" && j.State == StatePending && p.score > toMillis(j.RunAt)
}

// finishedState is the state whose jobs an index holds, when they are
// finished; 0 for the other indexes.
func finishedState(index string) State {
	switch index {
	case idxSucceeded:
		return StateSucceeded
	case idxFailed:
		return StateFailed
	case idxCanceled:
		return StateCanceled
	}
	return 0
}

func describe(p placed) string {
	if p.index == idxCorrupt {
		return "corrupt (the value cannot be read)"
	}
	return fmt.Sprintf("%s at %d", p.index, p.score)
}
