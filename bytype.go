package jobkey

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// DefaultTypeScan is how many entries CountByType reads of each index of
// each shard unless told.
const DefaultTypeScan = 1000

// TypeCount is how many jobs of one type are in each state.
type TypeCount struct {
	Type      string
	Pending   int64
	Active    int64
	Succeeded int64
	Failed    int64
	Canceled  int64
}

// TypeCounts is what CountByType found.
type TypeCounts struct {
	// Types are the types found, most jobs first (then by name).
	Types []TypeCount
	// Read is how many job values were read; Unreadable, how many of them
	// could not be decoded (never deleted: List and Verify show them).
	Read, Unreadable int64
	// Complete says every entry of every index was read: the counts are
	// exact as of the read. When false, they count the first Limit entries
	// of each index of each shard (the next due, the longest running, the
	// latest finished) and the rest were left out.
	Complete bool
}

// CountByType counts the jobs of each type in each state. No counter is
// kept per type: a type is in the job value only, and a count written by
// every transition beside the indexes would be one more thing that could
// disagree with the values. So CountByType reads values: the first limit
// entries (DefaultTypeScan when limit <= 0) of every index of every shard,
// and their values, in two round trips per node. It costs a read of each
// of those values, payload included: at the default, up to 14,000 values
// per shard. Each job is counted once, in the state its value says; a
// finished job whose retention ran out is not counted.
//
// When some shards cannot be read, it returns the counts of the others
// with a *ShardsError naming the missing ones.
func (q *Queue) CountByType(ctx context.Context, limit int) (TypeCounts, error) {
	if limit <= 0 {
		limit = DefaultTypeScan
	}
	if err := q.check(ctx, false); err != nil {
		return TypeCounts{}, err
	}
	indexes := slices.Concat(readyIndexes, []string{idxLeased, idxSucceeded, idxFailed, idxCanceled})
	ranges := make([][]*redis.StringSliceCmd, q.ks.shards)
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.ks.shards {
			for _, idx := range indexes {
				// One more than the limit says whether the index holds more.
				ranges[s] = append(ranges[s], p.ZRange(ctx, q.ks.index(s, idx), 0, int64(limit)))
			}
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return TypeCounts{}, fmt.Errorf("jobkey: count by type in %q: %w", q.name, err)
	}
	out := TypeCounts{Complete: true}
	missing := &ShardsError{Of: q.ks.shards}
	ids := make([][]string, q.ks.shards)
	for s := range q.ks.shards {
		seen := map[string]bool{}
		var shardIDs []string
		failed := false
		for _, c := range ranges[s] {
			got, err := c.Result()
			if err != nil {
				missing.add(s, readErr(c.Args()[1].(string), err))
				failed = true
				break
			}
			if len(got) > limit {
				got, out.Complete = got[:limit], false
			}
			for _, id := range got {
				if !seen[id] {
					seen[id] = true
					shardIDs = append(shardIDs, id)
				}
			}
		}
		if !failed {
			ids[s] = shardIDs
		}
	}
	gets := make([]*redis.SliceCmd, q.ks.shards)
	cmds, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s, list := range ids {
			if len(list) == 0 {
				continue
			}
			keys := make([]string, len(list))
			for i, id := range list {
				keys[i] = q.ks.jobKey(s, id)
			}
			gets[s] = p.MGet(ctx, keys...)
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return TypeCounts{}, fmt.Errorf("jobkey: count by type in %q: %w", q.name, err)
	}
	byType := map[string]*TypeCount{}
	for s, g := range gets {
		if g == nil {
			continue
		}
		vals, err := g.Result()
		if err != nil {
			missing.add(s, fmt.Errorf("jobkey: read values of shard %d: %w", s, err))
			continue
		}
		for _, v := range vals {
			raw, ok := v.(string)
			if !ok {
				continue // expired with its retention, deleted, or not a string (Verify reports those)
			}
			out.Read++
			var j Job
			if err := unmarshalReply(raw, &j); err != nil {
				out.Unreadable++
				continue
			}
			tc := byType[j.Type]
			if tc == nil {
				tc = &TypeCount{Type: j.Type}
				byType[j.Type] = tc
			}
			switch j.State {
			case StatePending:
				tc.Pending++
			case StateActive:
				tc.Active++
			case StateSucceeded:
				tc.Succeeded++
			case StateFailed:
				tc.Failed++
			case StateCanceled:
				tc.Canceled++
			}
		}
	}
	for _, tc := range byType {
		out.Types = append(out.Types, *tc)
	}
	total := func(t TypeCount) int64 { return t.Pending + t.Active + t.Succeeded + t.Failed + t.Canceled }
	slices.SortFunc(out.Types, func(a, b TypeCount) int {
		return cmp.Or(cmp.Compare(total(b), total(a)), cmp.Compare(a.Type, b.Type))
	})
	return out, missing.orNil()
}
