package jobkey_test

import (
	"context"
	"flag"
	"fmt"
	"testing"

	"github.com/jobkey/jobkey/internal/benchscenario"
	"github.com/jobkey/jobkey/internal/redistest"
)

// The single-key design against the multi-key one (internal/multikey), on
// the same Redis in one run, with nothing but the library's own
// dependencies: the bench module adds asynq and runs these same scenarios.
// Every op is one job; beside jobs/s each benchmark reports the client's
// and Redis's CPU per job (getrusage and INFO cpu over the timed phase) and
// allocations per job. Compare with benchstat:
//
//	go test -run '^$' -bench 'Enqueue|Lifecycle|Extend|Contended' -count 6 . > designs.txt
//	benchstat -col /design designs.txt

var benchRate = flag.Float64("rate", 5000, "BenchmarkBoundedRate: the producers' total enqueue rate, jobs/s")

var benchPayloads = []int{64, 1 << 10, 16 << 10, 256 << 10}

func benchSize(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// eachDesign runs scenario for both designs at every payload size, with
// 8 concurrent clients.
func eachDesign(b *testing.B, scenario string) {
	for _, size := range benchPayloads {
		for _, design := range benchscenario.Designs {
			b.Run(fmt.Sprintf("design=%s/payload=%s", design, benchSize(size)), func(b *testing.B) {
				benchscenario.Bench(b, design, benchscenario.Params{Scenario: scenario, Payload: size, Clients: 8},
					benchscenario.NewDesign)
			})
		}
	}
}

// BenchmarkEnqueue: 8 clients enqueue one job per call.
func BenchmarkEnqueue(b *testing.B) { eachDesign(b, benchscenario.Enqueue) }

// BenchmarkEnqueueAlone: one client enqueues 1 KiB jobs one at a time,
// the latency of a lone caller (p50-µs/call).
func BenchmarkEnqueueAlone(b *testing.B) {
	for _, design := range benchscenario.Designs {
		b.Run("design="+design, func(b *testing.B) {
			benchscenario.Bench(b, design, benchscenario.Params{Scenario: benchscenario.Enqueue, Payload: 1 << 10, Clients: 1},
				benchscenario.NewDesign)
		})
	}
}

// BenchmarkLifecycle: 8 clients each enqueue, claim and complete a job per call.
func BenchmarkLifecycle(b *testing.B) { eachDesign(b, benchscenario.Lifecycle) }

// BenchmarkExtend: 8 clients each renew the lease of the job they hold.
func BenchmarkExtend(b *testing.B) { eachDesign(b, benchscenario.Extend) }

// BenchmarkContended: N writers update the same 1 KiB job, where the
// single key's compare-and-set conflicts and the multi-key design's blind
// writes do not.
func BenchmarkContended(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		for _, design := range benchscenario.Designs {
			b.Run(fmt.Sprintf("design=%s/writers=%d", design, n), func(b *testing.B) {
				benchscenario.Bench(b, design, benchscenario.Params{Scenario: benchscenario.Contended, Payload: 1 << 10, Clients: n},
					benchscenario.NewDesign)
			})
		}
	}
}

// BenchmarkBurnDown: b.N jobs of 1 KiB enqueued first, then each design's
// own worker drains them on 8 slots with a handler that does nothing.
// Give it a fixed count (-benchtime 20000x).
func BenchmarkBurnDown(b *testing.B) {
	for _, design := range benchscenario.WorkerDesigns {
		b.Run("design="+design, func(b *testing.B) {
			benchscenario.BenchWork(b, design, benchscenario.WorkParams{Scenario: benchscenario.BurnDown, Payload: 1 << 10, Slots: 8},
				benchscenario.NewWorkerDesign)
		})
	}
}

// BenchmarkBoundedRate: 8 producers enqueue b.N jobs of 1 KiB at -rate
// jobs/s in all (default 5000) on an open-loop schedule while each
// design's worker runs 8 slots; reports the latency from each job's
// intended send time to its start (p50-ms, p99-ms, p99.9-ms) and fails a
// run whose producers ended behind their schedule by more than 2% of its
// length (or 100 ms). Give it a fixed count (-benchtime 10000x).
func BenchmarkBoundedRate(b *testing.B) {
	for _, design := range benchscenario.WorkerDesigns {
		b.Run("design="+design, func(b *testing.B) {
			benchscenario.BenchWork(b, design, benchscenario.WorkParams{Scenario: benchscenario.BoundedRate, Payload: 1 << 10,
				Slots: 8, Producers: 8, Rate: *benchRate}, benchscenario.NewWorkerDesign)
		})
	}
}

// BenchmarkFloor: the burn-down's commands with no hand-offs, one
// goroutine per pinned connection on 8 slots, at 1, 4, 16 and 64 jobs per
// transaction (internal/benchscenario/floor.go). It is the floor jobkey's
// client is measured against: BenchmarkBurnDown's client CPU per job less
// this one's is jobkey's own overhead.
func BenchmarkFloor(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			rdb := redistest.Client(b, nil)
			ctx := context.Background()
			f, err := benchscenario.NewFloor(ctx, rdb, benchscenario.FloorParams{Batch: n, Slots: 8, Payload: 1 << 10,
				Prefix: redistest.Prefix(b)})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			cpu, took, err := f.Run(ctx, b.N)
			if err != nil {
				b.Fatal(err)
			}
			jobs := int64(b.N)
			clientUs, redisUs, allocs, _ := cpu.PerJob(jobs)
			b.ReportMetric(float64(jobs)/took.Seconds(), "jobs/s")
			b.ReportMetric(clientUs, "client-µs/job")
			b.ReportMetric(redisUs, "redis-µs/job")
			b.ReportMetric(allocs, "allocs/job")
		})
	}
}
