// Package bench runs the benchmark scenarios of internal/benchscenario
// with asynq beside jobkey and the multi-key design. asynq lives in this
// module, never in the library's; bench_test.go and `jobkey bench` both run
// these, so the figures in the README and the ones a reader reproduces come
// from the same code.
package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkey/jobkey/internal/benchscenario"
	"github.com/redis/go-redis/v9"
)

// The scenarios and their types are benchscenario's.
const (
	Enqueue        = benchscenario.Enqueue
	EnqueueBatch   = benchscenario.EnqueueBatch
	Lifecycle      = benchscenario.Lifecycle
	LifecycleBatch = benchscenario.LifecycleBatch
	Extend         = benchscenario.Extend
	Contended      = benchscenario.Contended
	Drain          = benchscenario.Drain
	BurnDown       = benchscenario.BurnDown
	ProduceAndWork = benchscenario.ProduceAndWork
	BoundedRate    = benchscenario.BoundedRate
)

type (
	// Params describe one run.
	Params = benchscenario.Params
	// Tally is what every run counts; Result and WorkResult embed it.
	Tally = benchscenario.Tally
	// Result is what one run measured.
	Result = benchscenario.Result
	// WorkParams describe one worker run.
	WorkParams = benchscenario.WorkParams
	// WorkResult is what one worker run measured.
	WorkResult = benchscenario.WorkResult
	// Pacing is how closely bounded-rate producers kept their schedule.
	Pacing = benchscenario.Pacing
	// CPU is what a run's timed phase cost: the client's and Redis's CPU
	// time and the client's allocations.
	CPU = benchscenario.CPU
	// Probe counts a client's round trips, commands and bytes.
	Probe = benchscenario.Probe
	// Design is the interface the queue designs implement for the scenarios.
	Design = benchscenario.Design
	// WorkerDesign is a queue with a real worker.
	WorkerDesign = benchscenario.WorkerDesign
)

// Scenarios lists every scenario in report order.
var Scenarios = benchscenario.Scenarios

// Designs lists the design names every scenario knows.
var Designs = benchscenario.Designs

// EnqueueDesigns lists the designs of the enqueue scenario, which asynq
// joins: its Client is all a producer needs.
var EnqueueDesigns = []string{"jobkey", "multikey", "asynq"}

// WorkerDesigns lists the designs the worker scenarios know: jobkey's
// Work, the multi-key design's worker loop, and asynq's Server with its
// default configuration and with TaskCheckInterval lowered.
var WorkerDesigns = []string{"jobkey", "multikey", "asynq", "asynq-fast"}

// Client returns a client of url whose traffic p counts.
func Client(url string, p *Probe, poolSize int) (*redis.Client, error) {
	return benchscenario.Client(url, p, poolSize)
}

// Cleanup deletes every key under prefix.
func Cleanup(ctx context.Context, rdb redis.UniversalClient, prefix string) {
	benchscenario.Cleanup(ctx, rdb, prefix)
}

// Run runs one scenario of one design, asynq included, against the Redis
// at url, under a fresh key prefix that it deletes afterwards.
func Run(ctx context.Context, url, design string, p Params) (Result, error) {
	if design == "asynq" && p.Scenario != Enqueue {
		return Result{}, fmt.Errorf("bench: %s has only the %s scenario", design, Enqueue)
	}
	return benchscenario.RunWith(ctx, url, design, p, NewDesign)
}

// RunWork runs one worker scenario of one of WorkerDesigns.
func RunWork(ctx context.Context, url, design string, p WorkParams) (WorkResult, error) {
	return benchscenario.RunWorkWith(ctx, url, design, p, NewWorkerDesign)
}

// NewDesign builds a design by name. "asynq" supports the enqueue scenario
// only; its other methods return errors.ErrUnsupported. minReplicas is
// jobkey's Config.MinReplicas; the other designs have nothing like it.
func NewDesign(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (Design, error) {
	if name == "asynq" {
		return asynqProducer{newAsynq(rdb, prefix)}, nil
	}
	return benchscenario.NewDesign(name, rdb, prefix, minReplicas)
}

// asynqProducer is asynq's Client as a Design: enqueue only.
type asynqProducer struct{ *Asynq }

func (asynqProducer) EnqueueBatch(context.Context, [][]byte) error { return errors.ErrUnsupported }
func (asynqProducer) Claim(context.Context, string) (benchscenario.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (asynqProducer) ClaimMany(context.Context, string, int) ([]benchscenario.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (asynqProducer) Extend(context.Context, benchscenario.Handle) (benchscenario.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (asynqProducer) Complete(context.Context, benchscenario.Handle, []byte) error {
	return errors.ErrUnsupported
}
func (asynqProducer) CompleteMany(context.Context, []benchscenario.Handle) error {
	return errors.ErrUnsupported
}
func (asynqProducer) Put(context.Context, string, []byte) error    { return errors.ErrUnsupported }
func (asynqProducer) Update(context.Context, string, []byte) error { return errors.ErrUnsupported }
func (asynqProducer) Conflicts() int64                             { return 0 }
func (asynqProducer) Retries() int64                               { return 0 }
