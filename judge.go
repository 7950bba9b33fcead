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
	if raw.Missing {
		return value{missing: true}
	}
	if raw.Err != nil {
		return value{} // another Redis type
	}
	var j Job
	switch err := unmarshalString(raw.S, &j); {
	case err == nil && storedAt(key, &j) == nil:
		return value{job: &j}
	case err == nil:
		return value{} // the value of another job or queue, copied or forged: corrupt
	case errors.Is(err, ErrUnsupportedFormat):
		return value{newer: true}
	}
	return value{}
}

// recheck reads the suspects as one snapshot (cas.Engine.Snapshot: their
// values, then every index's ZSCORE of each, as of one moment) and returns
// the findings that still hold. Jobs that keep changing are tried three
// times, then left: a job that moves on is no finding.
func (q *Queue) recheck(ctx context.Context, shard int, now time.Time, ids []string) ([]Finding, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = q.ks.jobKey(shard, id)
	}
	for range 3 {
		scores := make([][]*redis.FloatCmd, len(ids))
		values, changed, err := q.cas.Snapshot(ctx, keys, func(p redis.Pipeliner) {
			for i, id := range ids {
				scores[i] = scores[i][:0]
				for _, idx := range allIndexes {
					scores[i] = append(scores[i], p.ZScore(ctx, q.ks.index(shard, idx), id))
				}
			}
		})
		if err != nil {
			return nil, fmt.Errorf("jobkey: verify: read %d jobs: %w", len(ids), err)
		}
		if changed {
			continue // a job changed since its GET: read again
		}
		var out []Finding
		for i, id := range ids {
			var have []placed
			for k, c := range scores[i] {
				if s, err := c.Result(); err == nil {
					have = append(have, placed{allIndexes[k], int64(s)})
				}
			}
			if f, bad := q.judge(id, readValue(values[i], keys[i]), have, now); bad {
				out = append(out, f)
			}
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
