package multikey

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SweepReport says what one reconciling sweep found and repaired.
type SweepReport struct {
	Records            int   // job records scanned
	Orphans            int   // pending records in no list: re-listed
	ActiveWithoutLease int   // in active with no lease entry for two sweeps: re-queued
	ExpiredLeases      int   // lease deadline passed: re-queued
	CountDrift         int64 // counter minus the pending list's length, as found
	RoundTrips         int   // what the sweep cost
	Elapsed            time.Duration
}

// Sweeper is the reconciling sweep the multi-key design needs: it walks
// every record and re-derives the pending list, the counter and the
// leases from them. It must run continuously, somewhere, for the design to
// stay correct. Keep one Sweeper per queue: it remembers suspects between
// runs, because a job between its pop and its lease group looks exactly
// like one whose claimer died.
type Sweeper struct {
	Q        *Queue
	suspects map[string]bool
}

// Sweep runs one pass.
func (s *Sweeper) Sweep(ctx context.Context) (SweepReport, error) {
	start := time.Now()
	q := s.Q
	var r SweepReport
	states := map[string]string{}
	var cursor uint64
	for {
		keys, next, err := q.rdb.Scan(ctx, cursor, q.tag+":job:*", 1000).Result()
		r.RoundTrips++
		if err != nil {
			return r, err
		}
		if len(keys) > 0 {
			cmds := make([]*redis.StringCmd, len(keys))
			_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, k := range keys {
					cmds[i] = p.HGet(ctx, k, "state")
				}
				return nil
			})
			r.RoundTrips++
			if err != nil && !errors.Is(err, redis.Nil) && !isRedisErr(err) {
				return r, err
			}
			for i, k := range keys {
				if st, err := cmds[i].Result(); err == nil {
					states[strings.TrimPrefix(k, q.tag+":job:")] = st
				}
			}
		}
		cursor = next
		if cursor == 0 {
			break
		}
	}
	r.Records = len(states)

	var pending, active *redis.StringSliceCmd
	var leases *redis.ZSliceCmd
	var count *redis.StringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		count = p.Get(ctx, q.CountKey())
		pending = p.LRange(ctx, q.PendingKey(), 0, -1)
		active = p.LRange(ctx, q.ActiveKey(), 0, -1)
		leases = p.ZRangeWithScores(ctx, q.LeasesKey(), 0, -1)
		return nil
	})
	r.RoundTrips++
	if err != nil && !isRedisErr(err) {
		return r, err
	}
	have, _ := strconv.ParseInt(count.Val(), 10, 64)
	r.CountDrift = have - int64(len(pending.Val()))
	listed := map[string]bool{}
	for _, id := range pending.Val() {
		listed[id] = true
	}
	inActive := map[string]bool{}
	for _, id := range active.Val() {
		listed[id], inActive[id] = true, true
	}
	leased := map[string]float64{}
	for _, z := range leases.Val() {
		leased[z.Member.(string)] = z.Score
	}

	now := float64(time.Now().UnixMilli())
	var requeue, relist []string
	for id, st := range states {
		if st == "pending" && !listed[id] {
			relist = append(relist, id)
		}
	}
	suspects := map[string]bool{}
	for id := range inActive {
		score, ok := leased[id]
		switch {
		case !ok && s.suspects[id]:
			requeue = append(requeue, id)
			r.ActiveWithoutLease++
		case !ok:
			suspects[id] = true
		case score < now:
			requeue = append(requeue, id)
			r.ExpiredLeases++
		}
	}
	s.suspects = suspects
	r.Orphans = len(relist)

	if len(relist)+len(requeue) > 0 {
		_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range relist {
				p.LPush(ctx, q.PendingKey(), id)
			}
			for _, id := range requeue {
				p.LRem(ctx, q.ActiveKey(), 1, id)
				p.ZRem(ctx, q.LeasesKey(), id)
				p.HSet(ctx, q.JobKey(id), "state", "pending")
				p.LPush(ctx, q.PendingKey(), id)
			}
			return nil
		})
		r.RoundTrips++
		if err != nil {
			return r, err
		}
	}

	// The counter is re-derived from the list under WATCH, so a concurrent
	// enqueue or claim makes the repair retry instead of writing a stale
	// number.
	for try := 0; try < 10; try++ {
		err := q.rdb.Watch(ctx, func(tx *redis.Tx) error {
			n, err := tx.LLen(ctx, q.PendingKey()).Result()
			if err != nil {
				return err
			}
			c, err := tx.Get(ctx, q.CountKey()).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			have, _ := strconv.ParseInt(c, 10, 64)
			r.RoundTrips += 4
			if have == n {
				return nil
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, q.CountKey(), n, 0)
				return nil
			})
			return err
		}, q.PendingKey(), q.CountKey())
		if !errors.Is(err, redis.TxFailedErr) {
			if err != nil {
				return r, err
			}
			break
		}
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

// Partial counts the partial states a multi-key queue holds, read without
// repairing anything. Run it on a quiet queue: a job between its pop and
// its lease group looks like an active job without a lease.
type Partial struct {
	Records            int   // job records
	Orphans            int   // pending records in no list: invisible to consumers
	ActiveWithoutLease int   // in the active list with no lease entry
	ExpiredLeases      int   // leases run out: nobody reclaims them but the sweep
	Duplicates         int   // IDs listed more than once (a retried enqueue)
	CountDrift         int64 // queued-count minus the pending list's length
}

// Inspect reads every record and index and counts the partial states.
func (q *Queue) Inspect(ctx context.Context) (Partial, error) {
	var p Partial
	states := map[string]string{}
	iter := q.rdb.Scan(ctx, 0, q.tag+":job:*", 1000).Iterator()
	for iter.Next(ctx) {
		st, err := q.rdb.HGet(ctx, iter.Val(), "state").Result()
		if err == nil {
			states[strings.TrimPrefix(iter.Val(), q.tag+":job:")] = st
		}
	}
	if err := iter.Err(); err != nil {
		return p, err
	}
	p.Records = len(states)
	pending, err := q.rdb.LRange(ctx, q.PendingKey(), 0, -1).Result()
	if err != nil {
		return p, err
	}
	active, err := q.rdb.LRange(ctx, q.ActiveKey(), 0, -1).Result()
	if err != nil {
		return p, err
	}
	leases, err := q.rdb.ZRangeWithScores(ctx, q.LeasesKey(), 0, -1).Result()
	if err != nil {
		return p, err
	}
	count, err := q.rdb.Get(ctx, q.CountKey()).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return p, err
	}
	p.CountDrift = count - int64(len(pending))
	listed := map[string]int{}
	for _, id := range append(pending, active...) {
		listed[id]++
	}
	for _, n := range listed {
		if n > 1 {
			p.Duplicates++
		}
	}
	leased := map[string]bool{}
	now := float64(time.Now().UnixMilli())
	for _, z := range leases {
		leased[z.Member.(string)] = true
		if z.Score < now {
			p.ExpiredLeases++
		}
	}
	for _, id := range active {
		if !leased[id] {
			p.ActiveWithoutLease++
		}
	}
	for id, st := range states {
		if st == "pending" && listed[id] == 0 {
			p.Orphans++
		}
	}
	return p, nil
}
