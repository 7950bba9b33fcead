package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// cpuReport is a report of one scenario run and one worker run, each of 100
// jobs that cost 5 ms of client CPU, 2 ms of Redis CPU and 4,000
// allocations: 50 µs, 20 µs and 40 allocations per job.
func cpuReport(redisCPU bool) report {
	cpu := bench.CPU{Client: 5 * time.Millisecond, Redis: 2 * time.Millisecond, Mallocs: 4000}
	tally := bench.Tally{Jobs: 100, Elapsed: time.Second}
	return report{
		RedisCPU: redisCPU,
		Results:  []bench.Result{{Design: "jobkey", Scenario: bench.Lifecycle, Payload: 1 << 10, Clients: 8, Tally: tally, CPU: cpu}},
		Work:     []bench.WorkResult{{Design: "jobkey", Scenario: bench.BurnDown, Payload: 1 << 10, Slots: 8, Tally: tally, CPU: cpu}},
	}
}

// Every table gives client CPU, Redis CPU and allocations per job beside
// jobs/s.
func TestReportGivesCPUAndAllocationsPerJob(t *testing.T) {
	md := cpuReport(true).markdown()
	require.Contains(t, md, "| jobs/s | jobkey × | p50 | p99 | cmds/job | rtt/job | wire B/job | client µs/job | Redis µs/job | allocs/job |")
	require.Contains(t, md, "| 1KiB | 8 | jobkey | 100 |  |")
	require.Contains(t, md, "| 50.0 | 20.0 | 40 | 0.000 | 0 |", "the scenario's row")
	require.Contains(t, md, "| jobs | jobs/s | jobkey × | rtt/job | cmds/job | client µs/job | Redis µs/job | allocs/job |")
	require.Contains(t, md, "| jobkey | 100 | 100 |  | 0.00 | 0.00 | 50.0 | 20.0 | 40 |", "the worker run's row")
	require.Contains(t, md, cpuChartFile)
	require.NotContains(t, md, "n/a")
}

// A server that does not report its CPU (miniredis has no INFO cpu) gets
// n/a for Redis's CPU per job, not a 0 that reads as free.
func TestReportSaysRedisCPUIsNAWhenTheServerDoesNotReportIt(t *testing.T) {
	md := cpuReport(false).markdown()
	require.Contains(t, md, "Redis µs/job is n/a")
	require.Contains(t, md, "| 50.0 | n/a | 40 | 0.000 | 0 |", "the scenario's row")
	require.Contains(t, md, "| jobkey | 100 | 100 |  | 0.00 | 0.00 | 50.0 | n/a | 40 |", "the worker run's row")
	require.NotContains(t, md, "20.0")
}

// redisReportsCPU asks the server for INFO cpu: Redis has it, miniredis
// does not, and neither does a server that cannot be reached.
func TestRedisReportsCPUOnlyWhereINFOCPUAnswers(t *testing.T) {
	ctx := context.Background()
	require.True(t, redisReportsCPU(ctx, redistest.RequireReal(t).URL))
	m := miniredis.RunT(t)
	require.False(t, redisReportsCPU(ctx, "redis://"+m.Addr()))
	require.False(t, redisReportsCPU(ctx, "redis://127.0.0.1:1"))
	require.False(t, redisReportsCPU(ctx, "not a url"))
}

// On the embedded server the client's CPU includes the server's, and the
// report says so.
func TestReportSaysTheEmbeddedServersCPUIsTheClients(t *testing.T) {
	rep := cpuReport(false)
	rep.Embedded = true
	require.Contains(t, rep.markdown(), "client µs/job includes its CPU")
	require.False(t, strings.Contains(cpuReport(false).markdown(), "includes its CPU"))
}

// boundedRateReport is a report of one bounded-rate run of jobkey at 5000
// jobs/s, which kept its rate or not.
func boundedRateReport(kept bool) report {
	pc := &bench.Pacing{Rate: 5000, Sent: 4998, LagP50: 20 * time.Microsecond, LagP99: 400 * time.Microsecond,
		LagMax: 3 * time.Millisecond, EndLag: 0, Slack: 0.02, Kept: true}
	if !kept {
		pc.Sent, pc.LagP99, pc.LagMax, pc.EndLag, pc.Kept = 3100, 900*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond, false
	}
	return report{RedisCPU: true, Work: []bench.WorkResult{{Design: "jobkey", Scenario: bench.BoundedRate, Payload: 1 << 10, Slots: 8,
		Producers: 8, Tally: bench.Tally{Jobs: 1000, Elapsed: 200 * time.Millisecond},
		P50: 1500 * time.Microsecond, P99: 4 * time.Millisecond, P999: 12 * time.Millisecond, Pacing: pc,
		CPU: bench.CPU{Client: 50 * time.Millisecond, Redis: 20 * time.Millisecond, Mallocs: 40000}}}}
}

// A bounded-rate run gets its own table: enqueue-to-start latency at p50,
// p99 and p99.9 beside the rate asked, the rate sent and the producers' lag.
func TestReportGivesBoundedRateLatenciesAndPacing(t *testing.T) {
	md := boundedRateReport(true).markdown()
	require.Contains(t, md, "## workers: bounded-rate")
	require.Contains(t, md, "| design | jobs | rate jobs/s | sent jobs/s | jobs/s | rtt/job | cmds/job | client µs/job | Redis µs/job | allocs/job "+
		"| p50 | p99 | p99.9 | lag p99 | lag max | end lag | rate kept |")
	require.Contains(t, md, "| jobkey | 1000 | 5000 | 4998 | 5000 | 0.00 | 0.00 | 50.0 | 20.0 | 40 | 1.50 ms | 4.00 ms | 12.00 ms | 400 µs | 3.00 ms | 0 µs | yes |")
	require.NotContains(t, md, "Rate not kept")
	require.NotContains(t, md, "backlog 1")
	require.NotContains(t, md, "Workers behind")
}

// A bounded-rate run whose producers kept the rate but whose workers
// processed well under it is flagged too: its latencies include the
// workers' backlog.
func TestReportFlagsABoundedRateRunWhoseWorkersFellBehind(t *testing.T) {
	rep := boundedRateReport(true)
	rep.Work[0].Elapsed = 400 * time.Millisecond // 2500 jobs/s of 5000
	require.Equal(t, []string{"jobkey"}, workersBehind(rep.Work))
	require.Contains(t, rep.markdown(), "> **Workers behind** for jobkey: they processed under 90% of the rate")
	rep.Work[0].Elapsed = 210 * time.Millisecond // 4762 jobs/s: a short run's tail
	require.Empty(t, workersBehind(rep.Work))
	require.Empty(t, workersBehind(boundedRateReport(false).Work), "a run that did not keep its rate is flagged as that")
}

// A bounded-rate run whose producers fell behind (RunWork returns no error
// then) is flagged in the report and in results.json, and its latencies
// are marked as a backlog's, never printed as the rate's.
func TestReportFlagsABoundedRateRunThatDidNotKeepItsRate(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	require.NoError(t, boundedRateReport(false).write(dir, &out, &errOut))
	md := out.String()
	require.Contains(t, md, "> **Rate not kept** by jobkey:")
	require.Contains(t, md, "| jobkey | 1000 | 5000 | 3100 | 5000 | 0.00 | 0.00 | 50.0 | 20.0 | 40 | backlog 1.50 ms | backlog 4.00 ms | backlog 12.00 ms "+
		"| 900.00 ms | 1500.00 ms | 1500.00 ms | **NO** |")
	require.NotContains(t, md, "| 1.50 ms | 4.00 ms |")
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	var rep struct {
		RateNotKept []string `json:"rate_not_kept"`
		Work        []bench.WorkResult
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, []string{"jobkey"}, rep.RateNotKept)
	require.False(t, rep.Work[0].Pacing.Kept)

	// A run that kept its rate leaves no flag in results.json.
	require.NoError(t, boundedRateReport(true).write(dir, &out, &errOut))
	b, err = os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	require.NotContains(t, string(b), "rate_not_kept")
}
