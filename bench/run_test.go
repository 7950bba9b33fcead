package bench_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Every scenario of every design runs to the end on a real Redis and
// counts what it did, so a benchmark that breaks fails CI before anyone
// reads its figures.
func TestScenariosRun(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	for _, scenario := range bench.Scenarios {
		designs := bench.Designs
		if scenario == bench.Enqueue {
			designs = bench.EnqueueDesigns
		}
		for _, design := range designs {
			t.Run(scenario+"/"+design, func(t *testing.T) {
				t.Parallel()
				const ops = 200
				r, err := bench.Run(context.Background(), url, design, bench.Params{Scenario: scenario, Payload: 1 << 10, Clients: 4, Ops: ops})
				require.NoError(t, err)
				require.Zero(t, r.Errors)
				require.GreaterOrEqual(t, r.Jobs, int64(ops), "the timed phase handles Ops jobs")
				require.Positive(t, r.Wire.RTT, "the probe counts round trips")
				require.Positive(t, r.Throughput())
			})
		}
	}
}

// asynq has only the enqueue scenario; the others say so.
func TestAsynqOnlyEnqueues(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	_, err := bench.Run(context.Background(), url, "asynq", bench.Params{Scenario: bench.Lifecycle, Ops: 10})
	require.Error(t, err)
}

// Every worker design drains a burn-down and keeps up with producers, and
// produce-and-work measures a latency for each job.
func TestWorkScenariosRun(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	for _, scenario := range []string{bench.BurnDown, bench.ProduceAndWork} {
		for _, design := range bench.WorkerDesigns {
			t.Run(scenario+"/"+design, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				const ops = 300
				r, err := bench.RunWork(ctx, url, design, bench.WorkParams{Scenario: scenario, Payload: 64, Slots: 4, Producers: 2, Ops: ops})
				require.NoError(t, err)
				require.EqualValues(t, ops, r.Jobs)
				require.Positive(t, r.Wire.RTT)
				if scenario == bench.ProduceAndWork {
					require.Positive(t, r.P50)
					require.GreaterOrEqual(t, r.P99, r.P50)
				}
			})
		}
	}
	require.True(t, slices.Contains(bench.WorkerDesigns, "asynq"))
}
