package benchscenario

import (
	"context"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

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
