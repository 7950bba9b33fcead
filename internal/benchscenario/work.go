package benchscenario

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/multikey"
	"github.com/redis/go-redis/v9"
)

// The worker scenarios run each design's own worker, as a service would.
const (
	// BurnDown: Ops jobs are enqueued first; then Slots worker slots drain
	// them with a handler that does nothing.
	BurnDown = "burn-down"
	// ProduceAndWork: Producers enqueue Ops jobs between them while Slots
	// worker slots run; reports processed jobs/s and enqueue-to-start
	// latency.
	ProduceAndWork = "produce-and-work"
)

// WorkerDesigns lists the designs the worker scenarios know here: jobkey's
// Work and the multi-key design's worker loop.
var WorkerDesigns = []string{"jobkey", "multikey"}

// WorkerDesign is a queue with a real worker.
type WorkerDesign interface {
	Enqueue(ctx context.Context, payload []byte) error
	// Work runs handle for every job on slots slots until ctx ends.
	Work(ctx context.Context, slots int, handle func(payload []byte)) error
	// Close releases what the design holds.
	Close()
}

// WorkerFactory builds a worker design by name on rdb under prefix.
type WorkerFactory func(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (WorkerDesign, error)

// NewWorkerDesign builds one of WorkerDesigns by name, on rdb under prefix;
// minReplicas is jobkey's Config.MinReplicas.
func NewWorkerDesign(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (WorkerDesign, error) {
	switch name {
	case "jobkey":
		d, err := NewJobkey(rdb, prefix, minReplicas)
		return jobkeyWorker{d}, err
	case "multikey":
		return multikeyWorker{NewMultikey(rdb, prefix)}, nil
	}
	return nil, fmt.Errorf("benchscenario: unknown worker design %q", name)
}

type jobkeyWorker struct{ *Jobkey }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func (d jobkeyWorker) Work(ctx context.Context, slots int, handle func([]byte)) error {
	return d.Q.Work(ctx, jobkey.HandlerFunc(func(_ context.Context, j *jobkey.Job) ([]byte, error) {
		handle(j.Payload)
		return nil, nil
	}), &jobkey.WorkOpts{Concurrency: slots, Logger: quiet, ShutdownGrace: time.Second})
}

func (d jobkeyWorker) Close() {}

type multikeyWorker struct{ *Multikey }

func (d multikeyWorker) Work(ctx context.Context, slots int, handle func([]byte)) error {
	return d.Q.Work(ctx, slots, "bench", func(j *multikey.Job) error { handle(j.Payload); return nil })
}

func (d multikeyWorker) Close() {}

// WorkParams describe one worker run.
type WorkParams struct {
	Scenario  string
	Payload   int // bytes, at least 8 (the enqueue time rides in the first 8)
	Slots     int // worker slots (default 8)
	Producers int // producers in produce-and-work (default 8)
	Ops       int // jobs
	// OnStart is called as the timed phase begins, OnEnd as it ends (when
	// the Ops-th job has been handled, before the workers shut down): a
	// benchmark's ResetTimer and StopTimer.
	OnStart, OnEnd func()
	// MinReplicas is jobkey's Config.MinReplicas (default 0; other
	// designs ignore it).
	MinReplicas int
}

// WorkResult is what one worker run measured.
type WorkResult struct {
	Design    string `json:"design"`
	Scenario  string `json:"scenario"`
	Payload   int    `json:"payload"`
	Slots     int    `json:"slots"`
	Producers int    `json:"producers"`
	Tally
	// P50 and P99 are enqueue-to-start latencies (produce-and-work).
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	Wire Snapshot      `json:"wire"`
	// CPU is what the client process and Redis spent over the timed phase.
	CPU CPU `json:"cpu"`
	// Batches are the sizes of jobkey's group-committed batches.
	Batches jobkey.BatchSizes `json:"batches"`
}

// RunWork runs one worker scenario of one of WorkerDesigns against the
// Redis at url, under a fresh prefix that it deletes afterwards. The timed
// phase ends when the Ops-th job has been handled.
func RunWork(ctx context.Context, url, design string, p WorkParams) (WorkResult, error) {
	return RunWorkWith(ctx, url, design, p, NewWorkerDesign)
}

// RunWorkWith is RunWork with the designs that newDesign builds.
func RunWorkWith(ctx context.Context, url, design string, p WorkParams, newDesign WorkerFactory) (WorkResult, error) {
	p.Slots = cmp.Or(p.Slots, 8)
	p.Producers = cmp.Or(p.Producers, 8)
	p.Payload = max(p.Payload, 8)
	if p.Ops <= 0 {
		return WorkResult{}, errors.New("benchscenario: a worker run needs Ops")
	}
	probe := &Probe{}
	rdb, err := Client(url, probe, 4*(p.Slots+p.Producers)+8)
	if err != nil {
		return WorkResult{}, err
	}
	defer rdb.Close()
	prefix := "bench-" + jobkey.NewID()
	defer Cleanup(context.WithoutCancel(ctx), rdb, prefix)
	d, err := newDesign(design, rdb, prefix, p.MinReplicas)
	if err != nil {
		return WorkResult{}, err
	}
	defer d.Close()

	payload := make([]byte, p.Payload)
	stamp := func() []byte {
		b := slices.Clone(payload)
		binary.BigEndian.PutUint64(b, uint64(time.Now().UnixNano()))
		return b
	}
	if p.Scenario == BurnDown {
		if err := fill(ctx, d, p.Ops, payload); err != nil {
			return WorkResult{}, fmt.Errorf("benchscenario: fill %s: %w", design, err)
		}
	} else if p.Scenario != ProduceAndWork {
		return WorkResult{}, fmt.Errorf("benchscenario: unknown worker scenario %q", p.Scenario)
	}

	var handled atomic.Int64
	all := make(chan struct{})
	lats := make([]time.Duration, p.Ops)
	handle := func(b []byte) {
		n := handled.Add(1)
		if n <= int64(p.Ops) && len(b) >= 8 {
			lats[n-1] = time.Duration(time.Now().UnixNano() - int64(binary.BigEndian.Uint64(b)))
		}
		if n == int64(p.Ops) {
			close(all)
		}
	}
	workCtx, stopWork := context.WithCancel(ctx)
	worked := make(chan error, 1)
	before := probe.Snap()
	if p.OnStart != nil {
		p.OnStart()
	}
	cpu, b0 := StartCPU(ctx, rdb), batches(d)
	start := time.Now()
	go func() { worked <- d.Work(workCtx, p.Slots, handle) }()
	var produced sync.WaitGroup
	if p.Scenario == ProduceAndWork {
		produce(ctx, &produced, d, p, stamp)
	}
	select {
	case <-all:
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	used, batched := cpu.Stop(ctx), batches(d).Sub(b0)
	if p.OnEnd != nil {
		p.OnEnd()
	}
	wire := probe.Snap().Sub(before)
	produced.Wait()
	stopWork()
	if err := <-worked; err != nil {
		return WorkResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WorkResult{}, err
	}
	r := WorkResult{Design: design, Scenario: p.Scenario, Payload: p.Payload, Slots: p.Slots,
		Tally: Tally{Jobs: int64(p.Ops), Elapsed: elapsed}, Wire: wire, CPU: used, Batches: batched}
	if p.Scenario == ProduceAndWork {
		r.Producers = p.Producers
		slices.Sort(lats)
		r.P50, r.P99 = percentile(lats, 0.50), percentile(lats, 0.99)
	}
	return r, nil
}

// produce starts p.Producers producers on wg that enqueue p.Ops stamped
// jobs between them, retrying a failed enqueue.
func produce(ctx context.Context, wg *sync.WaitGroup, d WorkerDesign, p WorkParams, stamp func() []byte) {
	var next atomic.Int64
	for range p.Producers {
		wg.Go(func() {
			for next.Add(1) <= int64(p.Ops) && ctx.Err() == nil {
				for d.Enqueue(ctx, stamp()) != nil && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}

// fill enqueues n jobs before a burn-down, eight at a time.
func fill(ctx context.Context, d WorkerDesign, n int, payload []byte) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := d.Enqueue(ctx, payload); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
