package jobkey

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/cpumeter"
	"github.com/jobkey/jobkey/internal/redistest"
)

// BenchmarkEventStream is what the event stream costs a transition: one
// client runs a job's three transitions (Enqueue, Claim, Complete) per
// op, 1 KiB payloads, on a queue with its events off, then on. Run it
// with -count 1 in a loop, so that off and on take turns and a noisy
// machine slows both (-count 10 would run off ten times, then on):
//
//	for i in $(seq 10); do go test -run '^$' -bench BenchmarkEventStream -count 1 .; done | tee events.txt
//	benchstat -col /events events.txt
//
// Beside ns/op it reports µs/transition (wall), the client's and Redis's
// CPU per transition (getrusage, INFO cpu), commands/transition and, with
// events on, stream-bytes/event: the stream's MEMORY USAGE over its
// length once the run is over.
func BenchmarkEventStream(b *testing.B) {
	redistest.RequireReal(b)
	payload := make([]byte, 1<<10)
	for _, on := range []bool{false, true} {
		name := "events=off"
		if on {
			name = "events=on"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			rdb, hook := redistest.Counted(b, 0)
			q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(b), SkipEvictionCheck: true})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := q.Enqueue(ctx, "warm", nil, nil); err != nil { // the queue's one-time checks
				b.Fatal(err)
			}
			if on {
				if err := q.EnableEvents(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := q.Claim(ctx, "w"); err != nil {
				b.Fatal(err)
			}
			hook.Reset()
			b.ReportAllocs()
			client0, redis0 := cpumeter.Process(), cpumeter.Redis(ctx, rdb)
			b.ResetTimer()
			for range b.N {
				if _, err := q.Enqueue(ctx, "t", payload, nil); err != nil {
					b.Fatal(err)
				}
				j, err := q.Claim(ctx, "w")
				if err != nil {
					b.Fatal(err)
				}
				if _, err := q.Complete(ctx, j, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			client, redisCPU := cpumeter.Process()-client0, cpumeter.Redis(ctx, rdb)-redis0
			const transitions = 3
			b.ReportMetric(float64(client.Microseconds())/float64(b.N*transitions), "client-µs/transition")
			b.ReportMetric(float64(redisCPU.Microseconds())/float64(b.N*transitions), "redis-µs/transition")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*transitions), "µs/transition")
			b.ReportMetric(float64(hook.Cmds.Load())/float64(b.N*transitions), "cmds/transition")
			b.ReportMetric(float64(hook.RTT.Load())/float64(b.N), "rtt/op")
			if on {
				stream := q.ks.streamKey(0)
				n, err := rdb.XLen(ctx, stream).Result()
				if err != nil {
					b.Fatal(err)
				}
				mem, err := rdb.MemoryUsage(ctx, stream, 0).Result()
				if err != nil {
					b.Fatal(err)
				}
				if n > 0 {
					b.ReportMetric(float64(mem)/float64(n), "stream-bytes/event")
				}
			}
		})
	}
}
