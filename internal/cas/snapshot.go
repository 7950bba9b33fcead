package cas

import (
	"context"
	"errors"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Snapshot reads keys under WATCH, then runs the read-only commands that
// queue adds in one MULTI/EXEC. The EXEC commits only if no key changed
// since it was read, so the values and the commands' replies are seen as
// of one moment, and no whole value is copied while Redis runs the EXEC.
// changed reports an EXEC that was aborted because a key changed: nothing
// the commands returned may then be used. The keys must share a hash
// slot on a cluster.
func (e *Engine) Snapshot(ctx context.Context, keys []string, queue func(p redis.Pipeliner)) (values []reply.Raw, changed bool, _ error) {
	err := e.rdb.Watch(ctx, func(tx *redis.Tx) error {
		e.c.roundTrips.Add(2)
		e.c.commands.Add(int64(1 + len(keys)))
		gets := make([]*redis.StringCmd, len(keys))
		cmds, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				gets[i] = p.Get(ctx, k)
			}
			return nil
		})
		if err != nil && (reply.Unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err)) {
			return err
		}
		cmds, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			queue(p)
			return nil
		})
		e.c.commands.Add(int64(len(cmds)))
		if err != nil && !errors.Is(err, redis.TxFailedErr) && (reply.Unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err)) {
			return err
		}
		if errors.Is(err, redis.TxFailedErr) {
			// A key changed since its GET: the replies are no snapshot
			// (every one carries the abort).
			changed = true
			return nil
		}
		values = make([]reply.Raw, len(keys))
		for i, g := range gets {
			values[i] = reply.FromGet(g)
		}
		return nil
	}, keys...)
	if err != nil {
		return nil, false, err
	}
	return values, changed, nil
}
