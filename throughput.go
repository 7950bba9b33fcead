package jobkey

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// MaxThroughputBuckets bounds the buckets one Throughput call counts: each
// costs three ZCOUNTs per shard (and, ahead of now, one per ready index),
// all in one round trip per node.
const MaxThroughputBuckets = 1000

// minThroughputTime and maxThroughputTime bound the times Throughput
// takes: milliseconds since 1970 span them, and a step either side, in an
// int64 (73 million years each way).
var (
	minThroughputTime = time.UnixMilli(-1 << 61).UTC()
	maxThroughputTime = time.UnixMilli(1 << 61).UTC()
)

// Throughput is a queue's history, counted from its finished indexes, and
// what is scheduled ahead, counted from its ready indexes, over equal
// buckets of time. No counter is kept anywhere: a finished job's index
// entry is scored by its finish time (docs/design.md, section 3), so the
// jobs that finished in a bucket are a ZCOUNT of that bucket, and nothing
// stored can drift from the jobs.
type Throughput struct {
	From, To time.Time // From is a whole Step; To is From + len(Buckets) × Step
	Step     time.Duration
	Now      time.Time // Redis's time when counted (the estimate; see Config.Now)
	Buckets  []ThroughputBucket
	// SucceededExactSince, FailedExactSince and CanceledExactSince say from
	// when each count is exact: a finished entry stays until its job's
	// retention has passed (Config.Retention, Config.FailedRetention) and
	// Trim removes it, so a bucket older than that undercounts. Two more
	// things make a count inexact at any age: a finished job deleted
	// (Queue.Delete, DeleteFinished) takes its entry with it, and a job with
	// a Retention of its own is scored that Retention less
	// Config.Retention after its finish (docs/design.md, section 13), so it
	// counts in a later bucket, or an earlier one when its Retention is
	// shorter (before From, uncounted, when the difference is that long).
	SucceededExactSince, FailedExactSince, CanceledExactSince time.Time
}

// ThroughputBucket counts the jobs that finished in [Start, Start+Step),
// and, for a bucket that ends after Now, the pending jobs whose run-at
// falls in it (the first such bucket from Now on: jobs due already are
// Stats.Due).
type ThroughputBucket struct {
	Start     time.Time
	Succeeded int64
	Failed    int64
	Canceled  int64
	Scheduled int64
}

// Throughput counts, over buckets of step from from to to, the jobs that
// finished in each and the jobs scheduled in each still ahead. from is
// rounded down and to up to whole steps (in Unix time), and step to whole
// milliseconds; at most MaxThroughputBuckets buckets are counted, of times
// within 73 million years of 1970 (ErrInvalid beyond).
//
// It reads every shard in one round trip per node. When some shards
// cannot be read, it returns the counts of the others with a *ShardsError
// naming the missing ones.
func (q *Queue) Throughput(ctx context.Context, from, to time.Time, step time.Duration) (Throughput, error) {
	step = step.Truncate(time.Millisecond)
	if step <= 0 {
		return Throughput{}, fmt.Errorf("%w: Throughput step %v, want at least 1ms", ErrInvalid, step)
	}
	if !to.After(from) {
		return Throughput{}, fmt.Errorf("%w: Throughput from %v is not before to %v", ErrInvalid, from, to)
	}
	if from.Before(minThroughputTime) || to.After(maxThroughputTime) {
		return Throughput{}, fmt.Errorf("%w: Throughput from %v to %v, want times within %v and %v", ErrInvalid, from, to, minThroughputTime, maxThroughputTime)
	}
	lo := toMillis(from) - mod(toMillis(from), step.Milliseconds())
	hi := toMillis(to)
	if r := mod(hi, step.Milliseconds()); r != 0 {
		hi += step.Milliseconds() - r
	}
	n := (hi - lo) / step.Milliseconds()
	if n > MaxThroughputBuckets {
		return Throughput{}, fmt.Errorf("%w: Throughput of %d buckets, at most %d", ErrInvalid, n, MaxThroughputBuckets)
	}
	if err := q.check(ctx, false); err != nil {
		return Throughput{}, err
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return Throughput{}, err
	}
	// Not fromMillis: 0 is 1970 here, not a time unset.
	t := Throughput{From: time.UnixMilli(lo).UTC(), To: time.UnixMilli(hi).UTC(), Step: step, Now: now, Buckets: make([]ThroughputBucket, n)}
	for i := range t.Buckets {
		t.Buckets[i].Start = time.UnixMilli(lo + int64(i)*step.Milliseconds()).UTC()
	}
	t.SucceededExactSince = now.Add(-q.cfg.Retention)
	t.FailedExactSince = now.Add(-q.cfg.FailedRetention)
	t.CanceledExactSince = now.Add(-q.cfg.Retention)

	// [start, end) in ZCOUNT's terms: start and "(end".
	bounds := func(i int) (string, string) {
		s := lo + int64(i)*step.Milliseconds()
		return strconv.FormatInt(s, 10), "(" + strconv.FormatInt(s+step.Milliseconds(), 10)
	}
	nowMS := toMillis(now)
	type shardCounts struct {
		ok, failed, canceled []*redis.IntCmd
		ahead                [][]*redis.IntCmd // per bucket, per ready index
	}
	per := make([]shardCounts, q.ks.shards)
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.ks.shards {
			c := &per[s]
			c.ok, c.failed, c.canceled = make([]*redis.IntCmd, n), make([]*redis.IntCmd, n), make([]*redis.IntCmd, n)
			c.ahead = make([][]*redis.IntCmd, n)
			for i := range int(n) {
				a, b := bounds(i)
				c.ok[i] = p.ZCount(ctx, q.ks.index(s, idxSucceeded), a, b)
				c.failed[i] = p.ZCount(ctx, q.ks.index(s, idxFailed), a, b)
				c.canceled[i] = p.ZCount(ctx, q.ks.index(s, idxCanceled), a, b)
				end := lo + int64(i+1)*step.Milliseconds()
				if end <= nowMS {
					continue
				}
				// Ahead of now: the pending jobs whose run-at is in the
				// bucket, and not yet due.
				if start := lo + int64(i)*step.Milliseconds(); start <= nowMS {
					a = "(" + strconv.FormatInt(nowMS, 10)
				}
				for prio := range MaxPriority + 1 {
					c.ahead[i] = append(c.ahead[i], p.ZCount(ctx, q.ks.index(s, readyIndex(prio)), a, b))
				}
			}
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return Throughput{}, fmt.Errorf("jobkey: throughput of %q: %w", q.name, err)
	}
	missing := &ShardsError{Of: q.ks.shards}
	for s, c := range per {
		if err := firstErr(c.ok, c.failed, c.canceled, c.ahead); err != nil {
			missing.add(s, err)
			continue
		}
		for i := range t.Buckets {
			b := &t.Buckets[i]
			b.Succeeded += c.ok[i].Val()
			b.Failed += c.failed[i].Val()
			b.Canceled += c.canceled[i].Val()
			for _, a := range c.ahead[i] {
				b.Scheduled += a.Val()
			}
		}
	}
	return t, missing.orNil()
}

// firstErr returns the first failed count of a shard, naming its key.
func firstErr(ok, failed, canceled []*redis.IntCmd, ahead [][]*redis.IntCmd) error {
	lists := append([][]*redis.IntCmd{ok, failed, canceled}, ahead...)
	for _, l := range lists {
		for _, c := range l {
			if c.Err() != nil {
				return readErr(c.Args()[1].(string), c.Err())
			}
		}
	}
	return nil
}

// mod is a modulo that is never negative (times before 1970).
func mod(a, b int64) int64 {
	if r := a % b; r < 0 {
		return r + b
	} else {
		return r
	}
}
