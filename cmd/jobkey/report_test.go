package main

import (
	"context"
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
