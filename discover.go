package jobkey

import (
	"cmp"
	"context"
	"errors"
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

// LookupShards returns the shard count of the queue name under prefix, as
// stored in Redis by the first Queue that reached it, so that tools can
// open a queue without being told its configuration. It returns
// ErrNotFound when no Queue of that name has reached Redis.
func LookupShards(ctx context.Context, rdb redis.UniversalClient, prefix, name string) (int, error) {
	if err := validName("queue name", name, false); err != nil {
		return 0, err
	}
	if err := validName("prefix", prefix, true); err != nil {
		return 0, err
	}
	key := newKeyspace(prefix, name, 1).metaKey()
	s, err := rdb.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, fmt.Errorf("%w: no queue %q under prefix %q", ErrNotFound, name, prefix)
	case err != nil:
		return 0, cmp.Or(unreachable(rdb, err), fmt.Errorf("jobkey: read %s: %w", key, err))
	}
	return parseShards(key, s)
}
