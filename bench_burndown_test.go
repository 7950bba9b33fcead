package jobkey_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
)

// BenchmarkWorkBurnDown drains b.N jobs of 1 KiB, enqueued first, with
// Work's 8 slots and a handler that does nothing, on queues of 1, 8 and 16
// shards of one Redis: the fused complete-and-claim and its read ahead,
// whose pool must see every shard. Give it a fixed count (-benchtime
// 20000x): a run of a few hundred jobs measures start-up more than work.
//
//	go test -run '^$' -bench WorkBurnDown -benchtime 20000x -count 3 .
func BenchmarkWorkBurnDown(b *testing.B) {
	url := redistest.RequireReal(b).URL
	for _, shards := range []int{1, 8, 16} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			opt, err := redis.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			rdb := redis.NewClient(opt)
			defer rdb.Close()
			hook := &rttcount.Hook{}
			rdb.AddHook(hook)
			q, err := jobkey.NewQueue(rdb, "burn", &jobkey.Config{Prefix: "bench-burn-" + jobkey.NewID(), Shards: shards,
				MaxBatch: 512, SkipEvictionCheck: true})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			payload := make([]byte, 1<<10)
			n := max(b.N, 100)
			for start := 0; start < n; start += 500 {
				specs := make([]jobkey.JobSpec, min(500, n-start))
				for i := range specs {
					specs[i] = jobkey.JobSpec{Type: "t", Payload: payload}
				}
				if _, err := q.EnqueueMany(ctx, specs); err != nil {
					b.Fatal(err)
				}
			}
			before := q.Metrics()
			hook.Reset()
			var handled atomic.Int64
			wctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			b.ResetTimer()
			go func() {
				done <- q.Work(wctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
					if handled.Add(1) == int64(n) {
						stop()
					}
					return nil, nil
				}), &jobkey.WorkOpts{Concurrency: 8, TrimInterval: -1})
			}()
			<-wctx.Done()
			b.StopTimer()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			m := q.Metrics()
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "jobs/s")
			b.ReportMetric(float64(hook.RTT.Load())/float64(n), "rtt/op")
			b.ReportMetric(float64(hook.Cmds.Load())/float64(n), "redis-cmds/op")
			b.ReportMetric(float64(m.Conflicts-before.Conflicts)/float64(n), "conflicts/op")
		})
	}
}
