package multikey

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Work runs handle for each job on slots goroutines until ctx ends: the
// multi-key design's worker, built as well as the design allows. Each
// slot fuses the completion of its last job with the claim of the next:
// one round trip sends the completion group and a blocking pop (BLMOVE,
// which also makes an idle slot wake the moment a job is pushed), the next
// round trip leases what the pop returned. Two round trips per job, and no
// polling. Like the design's other operations, nothing here can tell a
// worker whose lease expired from one that still holds it.
func (q *Queue) Work(ctx context.Context, slots int, worker string, handle func(*Job) error) error {
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() { q.slot(ctx, worker, handle) })
	}
	wg.Wait()
	return nil
}

// idleBlock is how long an idle slot's pop blocks before it looks at ctx.
// go-redis sends BLMOVE's timeout in whole seconds: it would round a
// shorter one up to a second anyway, and log that it did on every pop,
// into whatever the process prints (the benchmarks' result lines).
const idleBlock = time.Second

func (q *Queue) slot(ctx context.Context, worker string, handle func(*Job) error) {
	var done *Job // finished, not yet recorded
	for {
		if ctx.Err() != nil {
			if done != nil {
				_ = q.Complete(context.WithoutCancel(ctx), done, nil)
			}
			return
		}
		next, err := q.completeAndPop(ctx, done)
		if err != nil {
			if ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			continue // done stays unrecorded: tried again with the next pop
		}
		done = nil
		if next == "" {
			continue
		}
		jobs, err := q.lease(ctx, []string{next}, worker)
		if err != nil {
			continue // the sweep finds a popped job without a lease
		}
		if handle(jobs[0]) == nil {
			done = jobs[0]
		}
	}
}

// completeAndPop records done and pops the next ID onto active, in one
// round trip: MULTI, the completion group, LMOVE, EXEC. With nothing to
// record, it waits for the next ID with a blocking pop instead, up to
// idleBlock. "" means nothing came.
func (q *Queue) completeAndPop(ctx context.Context, done *Job) (string, error) {
	var id string
	var err error
	if done == nil {
		id, err = q.rdb.BLMove(ctx, q.PendingKey(), q.ActiveKey(), "RIGHT", "LEFT", idleBlock).Result()
	} else {
		var pop *redis.StringCmd
		_, err = q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, q.JobKey(done.ID), "state", "succeeded", "result", "")
			p.PExpire(ctx, q.JobKey(done.ID), q.Retention)
			p.LRem(ctx, q.ActiveKey(), 1, done.ID)
			p.ZRem(ctx, q.LeasesKey(), done.ID)
			pop = p.LMove(ctx, q.PendingKey(), q.ActiveKey(), "RIGHT", "LEFT")
			return nil
		})
		if err == nil || errors.Is(err, redis.Nil) {
			id, err = pop.Result()
		}
	}
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return id, err
}
