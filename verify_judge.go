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

func readValue(raw rawRead) value {
	if raw.missing {
		return value{missing: true}
	}
	if raw.err != nil {
		return value{} // another Redis type
	}
	var j Job
	switch err := unmarshalString(raw.s, &j); {
	case err == nil:
		return value{job: &j}
	case errors.Is(err, ErrUnsupportedFormat):
		return value{newer: true}
	}
	return value{}
}

// recheck reads the suspects as one snapshot (MULTI, then the GET and every
// index's ZSCORE of each, EXEC) and returns the findings that still hold.
func (q *Queue) recheck(ctx context.Context, node redis.Cmdable, shard int, now time.Time, ids []string) ([]Finding, error) {
	type snap struct {
		get    *redis.StringCmd
		scores []*redis.FloatCmd
	}
	snaps := make([]snap, len(ids))
	cmds, err := node.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			snaps[i].get = p.Get(ctx, q.ks.jobKey(shard, id))
			for _, idx := range allIndexes {
				snaps[i].scores = append(snaps[i].scores, p.ZScore(ctx, q.ks.index(shard, idx), id))
			}
		}
		return nil
	})
	if err != nil && (unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !isRedisErr(err)) {
		return nil, fmt.Errorf("jobkey: verify: read %d jobs: %w", len(ids), err)
	}
	var out []Finding
	for i, id := range ids {
		var have []placed
		for k, c := range snaps[i].scores {
			if s, err := c.Result(); err == nil {
				have = append(have, placed{allIndexes[k], int64(s)})
			}
		}
		if f, bad := q.judge(id, readValue(fromGet(snaps[i].get)), have, now); bad {
			out = append(out, f)
		}
	}
	return out, nil
}

// judge compares where a value says its ID belongs with the entries found.
func (q *Queue) judge(id string, v value, have []placed, now time.Time) (Finding, bool) {
	if v.newer {
		return Finding{}, false
	}
	if v.missing {
		for _, p := range have {
			if st := finishedState(p.index); st != 0 && p.score < toMillis(now.Add(-q.retention(st))) {
				continue // expired with its key; trimmed later
			}
			return Finding{ID: id, Kind: "stray-entry", Detail: fmt.Sprintf("in %s, but there is no job value", p.index)}, true
		}
		return Finding{}, false
	}
	want := placed{index: idxCorrupt}
	if v.job != nil {
		e := derive(v.job)
		want = placed{e.index, e.score}
	}
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
