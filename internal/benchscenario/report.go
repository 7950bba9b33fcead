package benchscenario

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
)

// Bench runs a scenario of design as benchmark b, one job per op, against
// the real Redis of redistest, and reports it (Report).
func Bench(b *testing.B, design string, p Params, newDesign Factory) {
	url := redistest.RequireReal(b).URL
	p.Ops = b.N
	p.OnStart = b.ResetTimer
	b.ReportAllocs()
	r, err := RunWith(context.Background(), url, design, p, newDesign)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if r.Errors > 0 {
		b.Logf("%d failed calls", r.Errors)
	}
	Report(b, r)
}

// Report puts a run's figures beside the benchmark's own: wire traffic,
// jobs/s, and the client's and Redis's CPU and the client's allocations
// per job over the timed phase.
func Report(b *testing.B, r Result) {
	b.ReportMetric(r.Per(r.Wire.RTT), "rtt/op")
	b.ReportMetric(r.Per(r.Wire.Cmds), "redis-cmds/op")
	b.ReportMetric(r.Per(r.Wire.BytesOut+r.Wire.BytesIn), "wire-B/op")
	b.ReportMetric(r.Throughput(), "jobs/s")
	b.ReportMetric(float64(r.P50.Nanoseconds())/1000, "p50-µs/call")
	reportCPU(b, r.CPU, r.Jobs)
	reportBatches(b, r.Batches)
	if r.Design == "jobkey" {
		b.ReportMetric(r.Per(r.Conflicts), "conflicts/op")
		b.ReportMetric(r.Per(r.Retries), "retries/op")
	}
}

// BenchWork runs a worker scenario of design as benchmark b for b.N jobs
// (at least 100) and reports it (ReportWork). A bounded-rate run whose
// producers fell behind their schedule fails: it measured a backlog. The
// run with b.N = 1, which the testing package makes first to size the
// next and then discards (with -benchtime Nx as well), is not judged.
func BenchWork(b *testing.B, design string, p WorkParams, newDesign WorkerFactory) {
	url := redistest.RequireReal(b).URL
	p.Ops = max(b.N, 100)
	p.OnStart, p.OnEnd = b.ResetTimer, b.StopTimer // shutting the workers down is not timed
	r, err := RunWorkWith(context.Background(), url, design, p, newDesign)
	if err != nil {
		b.Fatal(err)
	}
	if pc := r.Pacing; pc != nil && !pc.Kept && b.N > 1 {
		b.Fatalf("the producers did not keep %.0f jobs/s: they ended %v behind their schedule (%.0f jobs/s sent), an enqueue began up to %v late; p99 %v",
			pc.Rate, pc.EndLag, pc.Sent, pc.LagMax, r.P99)
	}
	ReportWork(b, r)
}

// ReportWork reports a worker run: jobs/s, round trips and commands per
// job, CPU and allocations per job, and for produce-and-work and
// bounded-rate the enqueue-to-start latency; for bounded-rate also how
// late the producers' enqueues began (lag-p99-ms, lag-max-ms).
func ReportWork(b *testing.B, r WorkResult) {
	b.ReportMetric(r.Throughput(), "jobs/s")
	b.ReportMetric(r.Per(r.Wire.RTT), "rtt/op")
	b.ReportMetric(r.Per(r.Wire.Cmds), "redis-cmds/op")
	reportCPU(b, r.CPU, r.Jobs)
	reportBatches(b, r.Batches)
	if r.Scenario == ProduceAndWork || r.Scenario == BoundedRate {
		b.ReportMetric(ms(r.P50), "p50-ms")
		b.ReportMetric(ms(r.P99), "p99-ms")
		b.ReportMetric(ms(r.P999), "p99.9-ms")
	}
	if r.Pacing != nil {
		b.ReportMetric(ms(r.Pacing.LagP99), "lag-p99-ms")
		b.ReportMetric(ms(r.Pacing.LagMax), "lag-max-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func reportCPU(b *testing.B, c CPU, jobs int64) {
	client, redis, allocs, bytes := c.PerJob(jobs)
	b.ReportMetric(client, "client-µs/job")
	b.ReportMetric(redis, "redis-µs/job")
	b.ReportMetric(allocs, "allocs/job")
	b.ReportMetric(bytes, "B/job")
}

// reportBatches gives the mean size of group-committed batches and the
// share of them that carried a single call.
func reportBatches(b *testing.B, s jobkey.BatchSizes) {
	if s.Flushes == 0 {
		return
	}
	b.ReportMetric(s.Mean(), "calls/batch")
	b.ReportMetric(100*float64(s.Buckets[0])/float64(s.Flushes), "single-batch-%")
}
