package benchscenario

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestParseCPUAddsSystemAndUserTime(t *testing.T) {
	t.Parallel()
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.750000\r\nused_cpu_sys_children:9.000000\r\n"
	require.Equal(t, 2*time.Second, parseCPU(info))
	require.Zero(t, parseCPU("used_cpu_sys:bogus\r\n"))
}

// A run measures the CPU the client and Redis spent and what the client
// allocated over its timed phase.
func TestRunMeasuresCPUPerJob(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	for _, design := range Designs {
		r, err := Run(context.Background(), url, design, Params{Scenario: Lifecycle, Payload: 1 << 10, Clients: 4, Ops: 300})
		require.NoError(t, err)
		require.Positive(t, r.CPU.Client, design)
		require.Positive(t, r.CPU.Redis, design)
		require.Positive(t, r.CPU.Mallocs, design)
		client, redis, allocs, _ := r.CPU.PerJob(r.Jobs)
		require.Positive(t, client)
		require.Positive(t, redis)
		require.Positive(t, allocs)
	}
}
