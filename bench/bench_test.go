package bench_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jobkey/jobkey/bench"
)

// The benchmarks compare jobkey with the multi-key design on the same
// server in one run. Every op is one job. Compare with benchstat:
//
//	go test -run '^$' -bench 'Lifecycle' -count 10 . > lifecycle.txt
//	benchstat -col /design lifecycle.txt

var payloads = []int{64, 1 << 10, 16 << 10, 256 << 10}

func sizeName(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func runScenario(b *testing.B, design string, p bench.Params) {
	url := realURL(b)
	p.Ops = b.N
	p.OnStart = b.ResetTimer
	b.ReportAllocs()
	r, err := bench.Run(context.Background(), url, design, p)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if r.Errors > 0 {
		b.Logf("%d failed calls", r.Errors)
	}
	b.ReportMetric(r.Per(r.Wire.RTT), "rtt/op")
	b.ReportMetric(r.Per(r.Wire.Cmds), "redis-cmds/op")
	b.ReportMetric(r.Per(r.Wire.BytesOut+r.Wire.BytesIn), "wire-B/op")
	b.ReportMetric(r.Throughput(), "jobs/s")
	if design == "jobkey" {
		b.ReportMetric(r.Per(r.Conflicts), "conflicts/op")
		b.ReportMetric(r.Per(r.Retries), "retries/op")
	}
}

// each runs a scenario for every design that has it at every payload size.
func each(b *testing.B, scenario string, clients int, sizes []int) {
	designs := bench.Designs
	if scenario == bench.Enqueue {
		designs = bench.EnqueueDesigns
	}
	for _, size := range sizes {
		for _, design := range designs {
			b.Run(fmt.Sprintf("design=%s/payload=%s", design, sizeName(size)), func(b *testing.B) {
				runScenario(b, design, bench.Params{Scenario: scenario, Payload: size, Clients: clients})
			})
		}
	}
}

func BenchmarkEnqueue(b *testing.B)        { each(b, bench.Enqueue, 8, payloads) }
func BenchmarkEnqueueBatch(b *testing.B)   { each(b, bench.EnqueueBatch, 8, payloads) }
func BenchmarkLifecycle(b *testing.B)      { each(b, bench.Lifecycle, 8, payloads) }
func BenchmarkLifecycleBatch(b *testing.B) { each(b, bench.LifecycleBatch, 8, payloads) }
func BenchmarkExtend(b *testing.B)         { each(b, bench.Extend, 8, payloads) }

// BenchmarkContended has N writers updating the same job.
func BenchmarkContended(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		for _, design := range bench.Designs {
			b.Run(fmt.Sprintf("design=%s/writers=%d", design, n), func(b *testing.B) {
				runScenario(b, design, bench.Params{Scenario: bench.Contended, Payload: 1 << 10, Clients: n})
			})
		}
	}
}

// BenchmarkDrain has N claimers draining one queue.
func BenchmarkDrain(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		for _, design := range bench.Designs {
			b.Run(fmt.Sprintf("design=%s/claimers=%d", design, n), func(b *testing.B) {
				runScenario(b, design, bench.Params{Scenario: bench.Drain, Payload: 1 << 10, Clients: n})
			})
		}
	}
}

// runWork runs a worker scenario for b.N jobs and reports jobs/s, round
// trips and commands per job, and, for produce-and-work, the
// enqueue-to-start latency.
func runWork(b *testing.B, design string, p bench.WorkParams) {
	url := realURL(b)
	p.Ops = max(b.N, 100)
	p.OnStart, p.OnEnd = b.ResetTimer, b.StopTimer // shutting the workers down is not timed
	r, err := bench.RunWork(context.Background(), url, design, p)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.Throughput(), "jobs/s")
	b.ReportMetric(r.Per(r.Wire.RTT), "rtt/op")
	b.ReportMetric(r.Per(r.Wire.Cmds), "redis-cmds/op")
	if p.Scenario == bench.ProduceAndWork {
		b.ReportMetric(float64(r.P50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(r.P99.Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkBurnDown: b.N jobs enqueued first, then 8 worker slots of each
// design's own worker drain them with a handler that does nothing. Give
// the worker scenarios a fixed count (-benchtime 20000x): a run of a few
// hundred jobs measures start-up more than work.
func BenchmarkBurnDown(b *testing.B) {
	for _, design := range bench.WorkerDesigns {
		b.Run("design="+design, func(b *testing.B) {
			runWork(b, design, bench.WorkParams{Scenario: bench.BurnDown, Payload: 1 << 10, Slots: 8})
		})
	}
}

// BenchmarkProduceAndWork: 8 producers enqueue b.N jobs while 8 worker
// slots run.
func BenchmarkProduceAndWork(b *testing.B) {
	for _, design := range bench.WorkerDesigns {
		b.Run("design="+design, func(b *testing.B) {
			runWork(b, design, bench.WorkParams{Scenario: bench.ProduceAndWork, Payload: 1 << 10, Slots: 8, Producers: 8})
		})
	}
}
