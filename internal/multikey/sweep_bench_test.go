package multikey

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkSweep measures what the multi-key design pays for repair: one
// reconciling pass over a queue of n job records (nothing to repair, so
// this is the floor). The sweep has to run continuously for the design to
// stay correct; multiply by how often you run it.
func BenchmarkSweep(b *testing.B) {
	url := redistest.RequireReal(b).URL
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			rdb := redistest.ClientFor(b, url, func(o *redis.Options) { o.ReadTimeout = time.Minute })
			ctx := context.Background()
			q := New(rdb, redistest.Prefix(b), "q")
			for i := 0; i < n; i += 1000 {
				ids := make([]string, 0, 1000)
				payloads := make([][]byte, 0, 1000)
				for k := i; k < min(n, i+1000); k++ {
					ids = append(ids, fmt.Sprint(k))
					payloads = append(payloads, make([]byte, 1024))
				}
				if err := q.EnqueueBatch(ctx, ids, payloads); err != nil {
					b.Fatal(err)
				}
			}
			b.Cleanup(func() {
				var cursor uint64
				for {
					keys, next, _ := rdb.Scan(ctx, cursor, q.tag+"*", 1000).Result()
					if len(keys) > 0 {
						rdb.Unlink(ctx, keys...)
					}
					if cursor = next; cursor == 0 {
						return
					}
				}
			})
			s := &Sweeper{Q: q}
			var rtts int
			b.ResetTimer()
			for b.Loop() {
				r, err := s.Sweep(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if r.Records != n {
					b.Fatalf("swept %d records, want %d", r.Records, n)
				}
				rtts += r.RoundTrips
			}
			b.ReportMetric(float64(rtts)/float64(b.N), "rtt/sweep")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n)*1000, "ns/record")
		})
	}
}
