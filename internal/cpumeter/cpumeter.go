// Package cpumeter reads what a measured phase cost in CPU: this
// process's (getrusage) and Redis's (INFO cpu). The benchmarks report both
// per job, beside jobs/s.
package cpumeter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the CPU time Redis reports having used, summed over a
// cluster's masters; 0 when INFO fails.
func Redis(ctx context.Context, rdb redis.UniversalClient) time.Duration {
	one := func(c *redis.Client) time.Duration {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return 0
		}
		return parse(info)
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

// parse adds used_cpu_sys and used_cpu_user of an INFO cpu reply.
func parse(info string) time.Duration {
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
