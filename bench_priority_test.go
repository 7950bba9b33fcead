package jobkey_test

import (
	"context"
	"fmt"
	"testing"

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
