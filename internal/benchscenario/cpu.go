package benchscenario

import (
	"context"
	"runtime"
	"time"

	"github.com/jobkey/jobkey/internal/cpumeter"
	"github.com/redis/go-redis/v9"
)

// CPU is what a timed phase cost: the client process's CPU time
// (getrusage), Redis's (INFO cpu, used_cpu_sys plus used_cpu_user, summed
// over a cluster's masters), and the client's heap allocations.
type CPU struct {
	Client     time.Duration `json:"client_ns"`
	Redis      time.Duration `json:"redis_ns"`
	Mallocs    uint64        `json:"mallocs"`
	AllocBytes uint64        `json:"alloc_bytes"`
}

// PerJob is c divided by jobs, in microseconds of CPU, allocations and
// bytes per job.
func (c CPU) PerJob(jobs int64) (clientUs, redisUs, allocs, bytes float64) {
	if jobs <= 0 {
		return 0, 0, 0, 0
	}
	n := float64(jobs)
	return float64(c.Client.Microseconds()) / n, float64(c.Redis.Microseconds()) / n,
		float64(c.Mallocs) / n, float64(c.AllocBytes) / n
}

// CPUMeter measures a timed phase; StartCPU begins it.
type CPUMeter struct {
	rdb    redis.UniversalClient
	client time.Duration
	redis  time.Duration
	mem    runtime.MemStats
}

// StartCPU reads the counters at the start of a timed phase.
func StartCPU(ctx context.Context, rdb redis.UniversalClient) *CPUMeter {
	m := &CPUMeter{rdb: rdb}
	m.redis = cpumeter.Redis(ctx, rdb)
	runtime.ReadMemStats(&m.mem)
	m.client = cpumeter.Process()
	return m
}

// Stop reads the counters again and returns what the phase used.
func (m *CPUMeter) Stop(ctx context.Context) CPU {
	client := cpumeter.Process()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	return CPU{
		Client:     client - m.client,
		Redis:      cpumeter.Redis(ctx, m.rdb) - m.redis,
		Mallocs:    mem.Mallocs - m.mem.Mallocs,
		AllocBytes: mem.TotalAlloc - m.mem.TotalAlloc,
	}
}
