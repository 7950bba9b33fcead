package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// MaxConcurrencyKeysListed bounds the keys ConcurrencyKeys returns.
const MaxConcurrencyKeysListed = 1000

// ConcurrencyKeys lists the concurrency keys of the queue that Redis holds
// a value for: a key with a limit or a rate of its own, or with leases or
// waiting jobs now. Each is read as Concurrency reads it. It finds them
// with SCAN on every master (the operator's ACL lines allow it; the
// worker's and producer's do not), so it costs a walk of the keyspace:
// an operator's call, not a hot path's. At most MaxConcurrencyKeysListed
// keys are returned, by name; more says the walk found more. When a
// master of a cluster cannot be scanned, it returns the keys of the others
// with a *ShardsError naming the shards that master holds.
func (q *Queue) ConcurrencyKeys(ctx context.Context) (keys []ConcurrencyInfo, more bool, err error) {
	if err := q.check(ctx, false); err != nil {
		return nil, false, err
	}
	pattern := slotKeyPattern(q.ks)
	var mu sync.Mutex
	var names []string
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		var found []string
		for it.Next(ctx) {
			// The value of a key lives in its name's shard; a key of the
			// pattern in another shard is not one of ours.
			name, ok := slotKeyName(q.ks, it.Val())
			if !ok || validConcurrencyKey(name) != nil {
				continue
			}
			found = append(found, name)
		}
		if err := it.Err(); err != nil {
			return cmp.Or(unreachable(c, err), fmt.Errorf("jobkey: scan %s: %w", pattern, err))
		}
		mu.Lock()
		names = append(names, found...)
		mu.Unlock()
		return nil
	}
	missing := &ShardsError{Of: q.ks.shards}
	switch c := q.rdb.(type) {
	case *redis.ClusterClient:
		// A master that cannot be scanned leaves out the shards it holds,
		// named; the others' keys are listed.
		failed := map[string]error{}
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			if err := scan(ctx, m); err != nil {
				mu.Lock()
				failed[m.Options().Addr] = err
				mu.Unlock()
			}
			return nil
		})
		if err != nil {
			return nil, false, cmp.Or(unreachable(c, err), err)
		}
		for s := range q.ks.shards {
			if len(failed) == 0 {
				break
			}
			m, err := c.MasterForKey(ctx, q.ks.index(s, idxReady))
			if err != nil {
				missing.add(s, fmt.Errorf("jobkey: find node of shard %d: %w", s, err))
			} else if err := failed[m.Options().Addr]; err != nil {
				missing.add(s, err)
			}
		}
		if len(failed) > 0 && len(missing.Shards) == 0 {
			// The masters that failed hold none of the queue's shards
			// now, by the client's map: their keys may have moved here.
			var errs []error
			for _, err := range failed {
				errs = append(errs, err)
			}
			return nil, false, errors.Join(errs...)
		}
	case *redis.Client:
		if err := scan(ctx, c); err != nil {
			return nil, false, err
		}
	default:
		return nil, false, fmt.Errorf("%w: ConcurrencyKeys needs a *redis.Client or a *redis.ClusterClient, got %T", ErrInvalid, q.rdb)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > MaxConcurrencyKeysListed {
		names, more = names[:MaxConcurrencyKeysListed], true
	}
	if len(names) == 0 {
		return nil, more, missing.orNil()
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return nil, false, err
	}
	gets := make([]*redis.StringCmd, len(names))
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			gets[i] = p.Get(ctx, q.ks.slotKey(q.ks.shardOf(n), n))
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return nil, false, fmt.Errorf("jobkey: concurrency keys of %q: %w", q.name, err)
	}
	aux := make(map[string]rawRead, len(names))
	for i, n := range names {
		aux[q.ks.slotKey(q.ks.shardOf(n), n)] = reply.FromGet(gets[i])
	}
	b := q.newSlotBook(&casRead{now: now, aux: aux})
	for _, n := range names {
		shard := q.ks.shardOf(n)
		e := b.entry(shard, &Job{ConcurrencyKey: n})
		info := ConcurrencyInfo{Key: n}
		if e.err != nil {
			info.Err = e.err
			keys = append(keys, info)
			continue
		}
		info.Limit, info.Own, info.Active, info.Waiting = b.limit(e), e.v.limit > 0, b.live(e), len(e.v.waiting)
		if e.v.rate > 0 {
			info.Rate, info.RatePeriod, info.Started = e.v.rate, time.Duration(e.v.period)*time.Millisecond, b.recent(e)
		}
		keys = append(keys, info)
	}
	return keys, more, missing.orNil()
}
