package bench_test

import (
	"flag"
	"fmt"
	"testing"

	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/benchscenario"
)

// The benchmarks compare jobkey with the multi-key design and asynq on the
// same server in one run, through the scenarios of internal/benchscenario
// that the root module's bench_test.go runs without asynq. Every op is one
// job. Compare with benchstat:
//
//	go test -run '^$' -bench 'Lifecycle' -count 10 . > lifecycle.txt
//	benchstat -col /design lifecycle.txt

var rate = flag.Float64("rate", 5000, "BenchmarkBoundedRate: the producers' total enqueue rate, jobs/s")

var payloads = []int{64, 1 << 10, 16 << 10, 256 << 10}

func sizeName(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func runScenario(b *testing.B, design string, p bench.Params) {
	benchscenario.Bench(b, design, p, bench.NewDesign)
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

func runWork(b *testing.B, design string, p bench.WorkParams) {
	benchscenario.BenchWork(b, design, p, bench.NewWorkerDesign)
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

// BenchmarkBoundedRate: 8 producers enqueue b.N jobs at -rate jobs/s in all
// (default 5000) on an open-loop schedule while 8 worker slots run, and
// the latency from each job's intended send time to its start is reported
// (p50-ms, p99-ms, p99.9-ms), with how late the producers' enqueues began
// (lag-p99-ms, lag-max-ms). A run whose producers ended behind their
// schedule by more than 2% of its length (or 100 ms) fails. Give it a
// fixed count (-benchtime 10000x).
func BenchmarkBoundedRate(b *testing.B) {
	for _, design := range bench.WorkerDesigns {
		b.Run("design="+design, func(b *testing.B) {
			runWork(b, design, bench.WorkParams{Scenario: bench.BoundedRate, Payload: 1 << 10, Slots: 8, Producers: 8, Rate: *rate})
		})
	}
}
