// Package heartbeat keeps a process's report in Redis the one-value way:
// a value with a TTL, and its member in a sorted set scored by when it
// lapses, so a reader finds the live reports without a SCAN and a process
// that dies drops off by itself, with no sweeper. Work's report of itself
// (workers.go) is one.
package heartbeat

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Beat is one write of a report.
type Beat struct {
	Key    string        // the report's value, written whole
	Value  []byte        //
	TTL    time.Duration // it lapses this long after now unless written again
	Set    string        // the sorted set that lists the reports, in Key's hash slot
	Member string        // the report's member in Set
	Now    time.Time     // Redis's time of the write
}

// Write writes b in one MULTI/EXEC: the value with its TTL, its member
// scored by when it lapses, and the removal of the members that lapsed
// already. The three commands cannot fail once the keys hold their types;
// a key of another type (written outside jobkey) makes EXEC answer an
// error for its step, which Write returns.
func Write(ctx context.Context, rdb redis.UniversalClient, b Beat) error {
	lapse := b.Now.Add(b.TTL).UnixMilli()
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, b.Key, b.Value, b.TTL)
		p.ZAdd(ctx, b.Set, redis.Z{Score: float64(lapse), Member: b.Member})
		p.ZRemRangeByScore(ctx, b.Set, "-inf", "("+strconv.FormatInt(b.Now.UnixMilli(), 10))
		return nil
	})
	return err
}

// Live returns the members of set whose reports have not lapsed at now.
func Live(ctx context.Context, rdb redis.UniversalClient, set string, now time.Time) ([]string, error) {
	return rdb.ZRangeByScore(ctx, set, &redis.ZRangeBy{Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
}

// Leave takes member off set at once; its value lapses by its TTL.
func Leave(ctx context.Context, rdb redis.UniversalClient, set, member string) error {
	return rdb.ZRem(ctx, set, member).Err()
}
