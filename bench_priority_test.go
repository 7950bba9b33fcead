package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClaimPriority is the cost of priorities per claim: a claim and a
// completion of a due job, one at a time (no group commit, no read ahead
// to share), on a queue whose jobs all have priority 0 and on one whose
// jobs spread over every priority. Each claim reads the due entries of
// every priority's index in its first round trip, whether they are used or
// not, so the extra cost is in commands, not round trips.
func BenchmarkClaimPriority(b *testing.B) {
	url := redistest.RequireReal(b).URL
	for _, spread := range []int{1, jobkey.MaxPriority + 1} {
		b.Run(fmt.Sprintf("priorities=%d", spread), func(b *testing.B) {
			opt, err := redis.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			rdb := redis.NewClient(opt)
			defer rdb.Close()
			hook := &rttcount.Hook{}
			rdb.AddHook(hook)
			q, err := jobkey.NewQueue(rdb, "prio", &jobkey.Config{Prefix: "bench-prio-" + jobkey.NewID(), DisableGroupCommit: true})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			const depth = 1000 // jobs due at every claim
			specs := make([]jobkey.JobSpec, depth)
			for i := range specs {
				specs[i] = jobkey.JobSpec{Type: "t", Opts: &jobkey.EnqueueOpts{Priority: i % spread}}
			}
			if _, err := q.EnqueueMany(ctx, specs); err != nil {
				b.Fatal(err)
			}
			hook.Reset()
			var cmds, rtts int64
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				if _, err := q.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{Priority: i % spread}); err != nil {
					b.Fatal(err)
				}
				hook.Reset()
				b.StartTimer()
				j, err := q.Claim(ctx, "w")
				if err != nil {
					b.Fatal(err)
				}
				rtts += hook.RTT.Load()
				cmds += hook.Cmds.Load()
				b.StopTimer()
				if _, err := q.Complete(ctx, j, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(rtts)/float64(b.N), "rtt/claim")
			b.ReportMetric(float64(cmds)/float64(b.N), "cmds/claim")
		})
	}
}

// BenchmarkClaimConcurrencyKey is the cost of concurrency keys per claim
// (concurrencykey.go), on a queue with Lease 1h (no lease runs out meanwhile)
// and no group commit or read ahead, as BenchmarkClaimPriority.
//
// With claimers=1 only the Claim is timed, as in BenchmarkClaimPriority,
// and each iteration first enqueues a job in the same way as the one it
// claims, so the backlog stays as it was:
//
//   - key=none: 1000 unkeyed jobs due; the baseline.
//   - key=own: 1000 jobs due, each with a key of its own (a key with room):
//     the claim reads the job's key's value (missing) in one more round trip
//     and writes it, holding one lease.
//   - key=hot: one key, limit 2, two jobs active and the others (waiting)
//     parked in its value's waiting list. Untimed, a new job of the key is
//     enqueued and met by a claim, which finds the key full and parks it
//     (rtt/park, cmds/park), and one active job completes, which pulls the
//     first waiting job forward. The timed claim then takes that job: it
//     reads and rewrites the key's value whole, key-bytes long.
//
// With claimers=4 an op is one job through the queue: four goroutines
// claim, complete and enqueue a job like it, each on a client of its own
// (claims, completions, enqueues), and ns/op is the wall time per job. A
// claimer that finds nothing due waits for the next completion (as a Work
// slot waits for the wake-up hint) and claims again: empty/claim counts
// those. Claims never retry a conflict (they move on), completions do:
// conflicts/claim and conflicts/complete are aborted EXECs per job.
func BenchmarkClaimConcurrencyKey(b *testing.B) {
	url := redistest.RequireReal(b).URL
	for _, c := range []struct {
		name     string
		key      string // "", "own" or "hot"
		waiting  int    // hot: jobs parked in the key's value
		claimers int
	}{
		{"key=none/claimers=1", "", 0, 1},
		{"key=own/claimers=1", "own", 0, 1},
		{"key=hot/limit=2/waiting=50/claimers=1", "hot", 50, 1},
		{"key=hot/limit=2/waiting=500/claimers=1", "hot", 500, 1},
		{"key=none/claimers=4", "", 0, 4},
		{"key=hot/limit=2/waiting=500/claimers=4", "hot", 500, 4},
	} {
		b.Run(c.name, func(b *testing.B) {
			bk := newKeyBench(b, url, c.key, c.waiting)
			if c.claimers == 1 {
				bk.serial(b)
			} else {
				bk.parallel(b, c.claimers)
			}
		})
	}
}

// keyBench is one sub-benchmark's queue, seen through three clients of its
// own, each counted by a hook of its own: claims, completions, enqueues.
type keyBench struct {
	key                 string
	claim, done, enq    *jobkey.Queue
	claimRT, rdb        *redis.Client
	claimHook, doneHook *rttcount.Hook
	prefix              string
	slotKey             string        // the hot key's value
	active              []*jobkey.Job // hot: the key's active jobs, oldest first
	n                   int           // jobs enqueued, for the own keys' names
}

func newKeyBench(b *testing.B, url, key string, waiting int) *keyBench {
	b.Helper()
	bk := &keyBench{key: key, prefix: "bench-ck-" + jobkey.NewID()}
	client := func() (*redis.Client, *rttcount.Hook, *jobkey.Queue) {
		opt, err := redis.ParseURL(url)
		if err != nil {
			b.Fatal(err)
		}
		rdb := redis.NewClient(opt)
		b.Cleanup(func() { rdb.Close() })
		hook := &rttcount.Hook{}
		rdb.AddHook(hook)
		q, err := jobkey.NewQueue(rdb, "ck", &jobkey.Config{Prefix: bk.prefix, DisableGroupCommit: true, Lease: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		return rdb, hook, q
	}
	bk.claimRT, bk.claimHook, bk.claim = client()
	_, bk.doneHook, bk.done = client()
	bk.rdb, _, bk.enq = client()
	ctx := context.Background()
	if key != "hot" {
		specs := make([]jobkey.JobSpec, 1000) // jobs due at every claim
		for i := range specs {
			specs[i] = jobkey.JobSpec{Type: "t", Opts: bk.opts()}
		}
		if _, err := bk.enq.EnqueueMany(ctx, specs); err != nil {
			b.Fatal(err)
		}
		return bk
	}
	if err := bk.enq.SetConcurrencyLimit(ctx, "hot", 2); err != nil {
		b.Fatal(err)
	}
	specs := make([]jobkey.JobSpec, 2+waiting)
	for i := range specs {
		specs[i] = jobkey.JobSpec{Type: "t", Opts: bk.opts()}
	}
	if _, err := bk.enq.EnqueueMany(ctx, specs); err != nil {
		b.Fatal(err)
	}
	for len(bk.active) < 2 {
		j, err := bk.claim.Claim(ctx, "w")
		if err != nil {
			b.Fatal(err)
		}
		bk.active = append(bk.active, j)
	}
	for { // every other job meets the full key, and parks
		if _, err := bk.claim.Claim(ctx, "w"); errors.Is(err, jobkey.ErrNoJob) {
			break
		} else if err != nil {
			b.Fatal(err)
		} else {
			b.Fatal("a third job of the key was claimed")
		}
	}
	info, err := bk.enq.Concurrency(ctx, "hot")
	if err != nil {
		b.Fatal(err)
	}
	if info.Active != 2 || info.Waiting != waiting {
		b.Fatalf("key before the run: %+v, want 2 active and %d waiting", info, waiting)
	}
	keys, err := bk.rdb.Keys(ctx, bk.prefix+":*:ck:hot").Result()
	if err != nil || len(keys) != 1 {
		b.Fatalf("the hot key's value: %v %v", keys, err)
	}
	bk.slotKey = keys[0]
	return bk
}

// opts are the options of the next job: its concurrency key.
func (bk *keyBench) opts() *jobkey.EnqueueOpts {
	bk.n++
	switch bk.key {
	case "own":
		return &jobkey.EnqueueOpts{ConcurrencyKey: fmt.Sprintf("own-%d", bk.n)}
	case "hot":
		return &jobkey.EnqueueOpts{ConcurrencyKey: "hot"}
	}
	return nil
}

func (bk *keyBench) serial(b *testing.B) {
	ctx := context.Background()
	var rtts, cmds, parkRTT, parkCmds, keyBytes int64
	m0 := bk.claim.Metrics()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		if _, err := bk.enq.Enqueue(ctx, "t", nil, bk.opts()); err != nil {
			b.Fatal(err)
		}
		if bk.key == "hot" {
			bk.claimHook.Reset()
			if _, err := bk.claim.Claim(ctx, "w"); !errors.Is(err, jobkey.ErrNoJob) {
				b.Fatalf("the new job should find its key full: %v", err)
			}
			parkRTT += bk.claimHook.RTT.Load()
			parkCmds += bk.claimHook.Cmds.Load()
			if _, err := bk.done.Complete(ctx, bk.active[0], nil); err != nil {
				b.Fatal(err)
			}
			bk.active = bk.active[1:]
		}
		bk.claimHook.Reset()
		b.StartTimer()
		j, err := bk.claim.Claim(ctx, "w")
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		rtts += bk.claimHook.RTT.Load()
		cmds += bk.claimHook.Cmds.Load()
		switch bk.key {
		case "hot":
			bk.active = append(bk.active, j)
			n, err := bk.rdb.StrLen(ctx, bk.slotKey).Result()
			if err != nil {
				b.Fatal(err)
			}
			keyBytes += n
		default:
			if bk.key == "own" {
				n, err := bk.rdb.StrLen(ctx, strings.TrimSuffix(bk.claim.Keys(j.ID).Ready, ":ready")+":ck:"+j.ConcurrencyKey).Result()
				if err != nil {
					b.Fatal(err)
				}
				keyBytes += n
			}
			if _, err := bk.done.Complete(ctx, j, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(rtts)/n, "rtt/claim")
	b.ReportMetric(float64(cmds)/n, "cmds/claim")
	b.ReportMetric(float64(bk.claim.Metrics().Conflicts-m0.Conflicts)/n, "conflicts/claim")
	if bk.key != "" {
		b.ReportMetric(float64(keyBytes)/n, "key-bytes")
	}
	if bk.key == "hot" {
		b.ReportMetric(float64(parkRTT)/n, "rtt/park")
		b.ReportMetric(float64(parkCmds)/n, "cmds/park")
	}
}

func (bk *keyBench) parallel(b *testing.B, claimers int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if bk.key == "hot" { // the two jobs held by the setup finish: two waiting jobs are pulled forward
		for _, j := range bk.active {
			if _, err := bk.done.Complete(ctx, j, nil); err != nil {
				b.Fatal(err)
			}
		}
		bk.active = nil
	}
	var mu sync.Mutex
	next := func() *jobkey.EnqueueOpts { mu.Lock(); defer mu.Unlock(); return bk.opts() }
	var bell struct {
		sync.Mutex
		ch chan struct{}
	}
	waitCh := func() <-chan struct{} {
		bell.Lock()
		defer bell.Unlock()
		if bell.ch == nil {
			bell.ch = make(chan struct{})
		}
		return bell.ch
	}
	ring := func() {
		bell.Lock()
		defer bell.Unlock()
		if bell.ch != nil {
			close(bell.ch)
			bell.ch = nil
		}
	}
	var empty atomic.Int64
	got := make(chan struct{})
	errs := make(chan error, claimers)
	var wg sync.WaitGroup
	bk.claimHook.Reset()
	c0, d0 := bk.claim.Metrics(), bk.done.Metrics()
	start := make(chan struct{})
	for w := range claimers {
		name := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			<-start
			for ctx.Err() == nil {
				woken := waitCh()
				j, err := bk.claim.Claim(ctx, name)
				if errors.Is(err, jobkey.ErrNoJob) {
					empty.Add(1)
					select {
					case <-woken:
					case <-time.After(5 * time.Millisecond):
					case <-ctx.Done():
					}
					continue
				}
				if err == nil {
					_, err = bk.done.Complete(ctx, j, nil)
				}
				if err == nil {
					_, err = bk.enq.Enqueue(ctx, "t", nil, next())
				}
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				ring()
				select {
				case got <- struct{}{}:
				case <-ctx.Done():
				}
			}
		})
	}
	for first := true; b.Loop(); first = false {
		if first {
			close(start) // the timer runs from here
		}
		select {
		case <-got:
		case err := <-errs:
			b.Fatal(err)
		}
	}
	b.StopTimer()
	rtt, cmds := bk.claimHook.RTT.Load(), bk.claimHook.Cmds.Load()
	c, d := bk.claim.Metrics(), bk.done.Metrics()
	cancel()
	wg.Wait()
	n := float64(b.N)
	b.ReportMetric(float64(rtt)/n, "rtt/claim")
	b.ReportMetric(float64(cmds)/n, "cmds/claim")
	b.ReportMetric(float64(c.Conflicts-c0.Conflicts)/n, "conflicts/claim")
	b.ReportMetric(float64(d.Conflicts-d0.Conflicts)/n, "conflicts/complete")
	b.ReportMetric(float64(empty.Load())/n, "empty/claim")
	if bk.key == "hot" {
		size, err := bk.rdb.StrLen(context.Background(), bk.slotKey).Result()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(size), "key-bytes")
	}
}
