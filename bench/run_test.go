package bench_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jobkey/jobkey/bench"
	"github.com/stretchr/testify/require"
)

// Every scenario of every design runs to the end on a real Redis and
// counts what it did, so a benchmark that breaks fails CI before anyone
// reads its figures.
func TestScenariosRun(t *testing.T) {
	t.Parallel()
	url := realURL(t)
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
	url := realURL(t)
	_, err := bench.Run(context.Background(), url, "asynq", bench.Params{Scenario: bench.Lifecycle, Ops: 10})
	require.Error(t, err)
}

// Every worker design drains a burn-down and keeps up with producers, and
// produce-and-work measures a latency for each job.
func TestWorkScenariosRun(t *testing.T) {
	t.Parallel()
	url := realURL(t)
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

// Every worker design runs the bounded-rate scenario: its producers keep
// the schedule and never send early, and it measures enqueue-to-start
// latencies at p50, p99 and p99.9.
func TestBoundedRateRunsForEveryDesign(t *testing.T) {
	t.Parallel()
	url := realURL(t)
	for _, design := range bench.WorkerDesigns {
		t.Run(design, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const ops, rate = 200, 400.0
			// On a loaded machine a stall of the whole process near the end
			// of a half-second run costs it a large share of its rate: the
			// slack is wide, and one of ten runs must keep the rate.
			var r bench.WorkResult
			for range 10 {
				var err error
				r, err = bench.RunWork(ctx, url, design, bench.WorkParams{Scenario: bench.BoundedRate, Payload: 64, Slots: 4,
					Producers: 4, Ops: ops, Rate: rate, RateSlack: 0.5})
				require.NoError(t, err)
				require.NotNil(t, r.Pacing)
				if r.Pacing.Kept {
					break
				}
				t.Logf("ended %v behind, an enqueue began %v late", r.Pacing.EndLag, r.Pacing.LagMax)
			}
			require.True(t, r.Pacing.Kept)
			require.EqualValues(t, ops, r.Jobs)
			require.Positive(t, r.Wire.RTT)
			require.LessOrEqual(t, r.Pacing.Sent, rate*1.0001, "no job goes out before its time")
			require.Positive(t, r.P50)
			require.GreaterOrEqual(t, r.P99, r.P50)
			require.GreaterOrEqual(t, r.P999, r.P99)
			require.Positive(t, r.CPU.Client)
		})
	}
}

// A scenario's result and a worker run's share one tally of jobs over
// time: the same rates, and the same "jobs" and "elapsed_ns" in the
// report's JSON.
func TestResultsShareOneTally(t *testing.T) {
	tally := bench.Tally{Jobs: 500, Elapsed: 2 * time.Second}
	for _, r := range []interface {
		Throughput() float64
		Per(int64) float64
	}{bench.Result{Tally: tally}, bench.WorkResult{Tally: tally}} {
		require.InDelta(t, 250.0, r.Throughput(), 1e-9)
		require.InDelta(t, 3.0, r.Per(1500), 1e-9)
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(raw, &fields))
		require.EqualValues(t, 500, fields["jobs"])
		require.EqualValues(t, 2e9, fields["elapsed_ns"])
	}
	require.Zero(t, bench.Tally{}.Throughput(), "no time, no rate")
	require.Zero(t, bench.Tally{}.Per(7), "no jobs, no share")
}
