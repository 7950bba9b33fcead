package benchscenario

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

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
	m.redis = redisCPU(ctx, rdb)
	runtime.ReadMemStats(&m.mem)
	m.client = processCPU()
	return m
}

// Stop reads the counters again and returns what the phase used.
func (m *CPUMeter) Stop(ctx context.Context) CPU {
	client := processCPU()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	return CPU{
		Client:     client - m.client,
		Redis:      redisCPU(ctx, m.rdb) - m.redis,
		Mallocs:    mem.Mallocs - m.mem.Mallocs,
		AllocBytes: mem.TotalAlloc - m.mem.TotalAlloc,
	}
}

// redisCPU is the CPU time Redis reports having used, summed over a
// cluster's masters; 0 when INFO fails.
func redisCPU(ctx context.Context, rdb redis.UniversalClient) time.Duration {
	one := func(c *redis.Client) time.Duration {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return 0
		}
		return parseCPU(info)
	}
	switch c := rdb.(type) {
	case *redis.Client:
		return one(c)
	case *redis.ClusterClient:
		var mu sync.Mutex
		var total time.Duration
		_ = c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
			d := one(n)
			mu.Lock()
			total += d
			mu.Unlock()
			return nil
		})
		return total
	}
	return 0
}

// parseCPU adds used_cpu_sys and used_cpu_user of an INFO cpu reply.
func parseCPU(info string) time.Duration {
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
