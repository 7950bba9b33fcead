package benchscenario

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor: what the burn-down's commands cost the client with nothing
// else: no hand-offs between goroutines, no batching waits, no decisions.
// Each slot is one goroutine on one pinned connection that, per
// transaction of n jobs, sends the two round trips a group commit of n
// finishes and n claims sends:
//
//  1. WATCH the 2n job keys and the shard's pause flag, TIME, MGET the 2n
//     values, TYPE of the three indexes it writes, ZRANGEBYSCORE of the
//     next n due entries (the read-ahead);
//  2. MULTI, SET of the n finished values (with their retention) and of
//     the n claimed ones, ZREM/ZADD moving the finished from leased to
//     succeeded and the claimed from ready to leased, EXEC.
//
// A job's value is rewritten twice per job, as in the burn-down (claim and
// finish), with the same payload. What the client does beyond this is
// jobkey's overhead over its floor.

// FloorParams set one floor run.
type FloorParams struct {
	Batch   int // jobs per transaction
	Slots   int // goroutines, each on a pinned connection
	Payload int // bytes per value
	Prefix  string
}

// FloorRun is a floor run set up: its keys written, ready to time.
type FloorRun struct {
	rdb                         *redis.Client
	p                           FloorParams
	value                       []byte
	keys                        [][]string
	ready, leased, done, paused string
}

// NewFloor writes the keys of a floor run on rdb.
func NewFloor(ctx context.Context, rdb *redis.Client, p FloorParams) (*FloorRun, error) {
	if p.Batch < 1 || p.Slots < 1 {
		return nil, fmt.Errorf("floor: batch %d and slots %d must be at least 1", p.Batch, p.Slots)
	}
	tag := p.Prefix + ":{floor}"
	f := &FloorRun{rdb: rdb, p: p, value: payload(p.Payload), keys: make([][]string, p.Slots),
		ready: tag + ":ready", leased: tag + ":leased", done: tag + ":succeeded", paused: tag + ":paused"}
	// Each slot works on keys of its own; the ready index holds enough
	// entries for every read.
	for s := range f.keys {
		for i := range 2 * p.Batch {
			f.keys[s] = append(f.keys[s], tag+":job:"+strconv.Itoa(s)+"-"+strconv.Itoa(i))
		}
		if err := rdb.MSet(ctx, pairs(f.keys[s], f.value)...).Err(); err != nil {
			return nil, err
		}
	}
	zs := make([]redis.Z, 1000)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(i), Member: "r" + strconv.Itoa(i)}
	}
	if err := rdb.ZAdd(ctx, f.ready, zs...).Err(); err != nil {
		return nil, err
	}
	return f, nil
}

// Run sends jobs jobs' worth of floor transactions, a batch at a time on
// every slot at once, and returns their CPU and how long they took.
func (f *FloorRun) Run(ctx context.Context, jobs int) (CPU, time.Duration, error) {
	var left atomic.Int64
	left.Store(int64(jobs))
	var firstErr error
	var mu sync.Mutex
	meter := StartCPU(ctx, f.rdb)
	start := time.Now()
	var wg sync.WaitGroup
	for s := range f.p.Slots {
		wg.Go(func() {
			conn := f.rdb.Conn()
			defer conn.Close()
			for left.Add(-int64(f.p.Batch)) > -int64(f.p.Batch) {
				if err := floorTxn(ctx, conn, f.keys[s], f.p.Batch, f.value, f.ready, f.leased, f.done, f.paused); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	return meter.Stop(ctx), took, firstErr
}

// floorTxn is one transaction of n finishes and n claims, in two round
// trips on conn.
func floorTxn(ctx context.Context, conn *redis.Conn, ks []string, n int, value []byte, ready, leased, done, paused string) error {
	_, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		watch := make([]any, 0, len(ks)+2)
		watch = append(watch, "watch")
		for _, k := range ks {
			watch = append(watch, k)
		}
		p.Do(ctx, append(watch, paused)...)
		p.Time(ctx)
		p.MGet(ctx, ks...)
		p.Type(ctx, ready)
		p.Type(ctx, leased)
		p.Type(ctx, done)
		p.ZRangeByScore(ctx, ready, &redis.ZRangeBy{Min: "-inf", Max: "+inf", Count: int64(n)})
		return nil
	})
	if err != nil {
		return err
	}
	_, err = conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		fin, claim := ks[:n], ks[n:]
		for _, k := range fin {
			p.Set(ctx, k, value, 24*time.Hour)
		}
		for _, k := range claim {
			p.Set(ctx, k, value, 0)
		}
		now := float64(time.Now().UnixMilli())
		rem := make([]any, len(fin))
		add := make([]redis.Z, len(fin))
		for i, k := range fin {
			rem[i], add[i] = k, redis.Z{Score: now, Member: k}
		}
		p.ZRem(ctx, leased, rem...)
		p.ZAdd(ctx, done, add...)
		rem = make([]any, len(claim))
		add = make([]redis.Z, len(claim))
		for i, k := range claim {
			rem[i], add[i] = k, redis.Z{Score: now + 30000, Member: k}
		}
		p.ZRem(ctx, ready, rem...)
		p.ZAdd(ctx, leased, add...)
		return nil
	})
	return err
}

func pairs(keys []string, v []byte) []any {
	out := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		out = append(out, k, v)
	}
	return out
}
