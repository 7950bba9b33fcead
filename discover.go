package jobkey

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Queues returns the names of every queue under prefix ("": "jobkey") that
// a Queue has reached, sorted, without being told their names: each queue
// stores its shard count in a meta key, and Queues walks those keys with
// SCAN on every master (SCAN needs the admin ACL line). Its cost grows with
// the database, not the queues: it is for tools, not for hot paths.
func Queues(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]string, error) {
	if prefix == "" {
		prefix = "jobkey"
	}
	if err := validName("prefix", prefix, true); err != nil {
		return nil, err
	}
	pattern := metaKeyPattern(prefix)
	var mu sync.Mutex // ForEachMaster scans the masters at once
	var names []string
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		var found []string
		for it.Next(ctx) {
			if name, ok := queueOfMetaKey(prefix, it.Val()); ok {
				found = append(found, name)
			}
		}
		if err := it.Err(); err != nil {
			return cmp.Or(unreachable(c, err), fmt.Errorf("jobkey: scan %s: %w", pattern, err))
		}
		mu.Lock()
		names = append(names, found...)
		mu.Unlock()
		return nil
	}
	var err error
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, scan)
	} else if c, ok := rdb.(*redis.Client); ok {
		err = scan(ctx, c)
	} else {
		return nil, fmt.Errorf("%w: Queues needs a *redis.Client or a *redis.ClusterClient, got %T", ErrInvalid, rdb)
	}
	if err != nil {
		return nil, cmp.Or(unreachable(rdb, err), err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
