package benchscenario

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	// ProduceAndWork: Producers enqueue Ops jobs between them as fast as
	// they can while Slots worker slots run; reports processed jobs/s and
	// enqueue-to-start latency, which grows with the backlog when the
	// producers outrun the workers (BoundedRate does not).
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
	// Rate is the bounded-rate scenario's total enqueue rate, jobs/s
	// (required there; other scenarios ignore it).
	Rate float64
	// RateSlack is how far behind its schedule, as a share of the
	// schedule's length, a bounded-rate run's producers may end before the
	// run counts as not keeping its rate (Pacing.Kept; default
	// DefaultRateSlack; never less than 100 ms).
	RateSlack float64
}

// WorkResult is what one worker run measured.
type WorkResult struct {
	Design    string `json:"design"`
	Scenario  string `json:"scenario"`
	Payload   int    `json:"payload"`
	Slots     int    `json:"slots"`
	Producers int    `json:"producers"`
	Tally
	// P50, P99 and P999 (p99.9) are enqueue-to-start latencies
	// (produce-and-work, bounded-rate). In bounded-rate they count from each
	// job's intended send time, in produce-and-work from its enqueue call.
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	// Pacing is how closely bounded-rate producers kept their schedule; a
	// run whose Pacing.Kept is false did not measure a bounded rate.
	Pacing *Pacing  `json:"pacing,omitempty"`
	Wire   Snapshot `json:"wire"`
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
	switch p.Scenario {
	case BurnDown:
		if err := fill(ctx, d, p.Ops, payload); err != nil {
			return WorkResult{}, fmt.Errorf("benchscenario: fill %s: %w", design, err)
		}
	case ProduceAndWork:
	case BoundedRate:
		if !(p.Rate > 0) || math.IsInf(p.Rate, 0) {
			return WorkResult{}, fmt.Errorf("benchscenario: %s needs a rate, not %v", BoundedRate, p.Rate)
		}
	default:
		return WorkResult{}, fmt.Errorf("benchscenario: unknown worker scenario %q", p.Scenario)
	}

	st := newStarts(p.Ops)
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var workErr error
	worked := make(chan struct{}) // closed when Work has returned workErr
	startWork := func() {
		go func() { workErr = d.Work(workCtx, p.Slots, st.handle); close(worked) }()
	}
	if p.Scenario == BoundedRate {
		// A steady rate is measured in a steady state: the worker is up
		// and has handled a job before the clock starts.
		startWork()
		if err := warmUp(ctx, d, payload, st.warmed, worked); err != nil {
			stopWork()
			<-worked
			return WorkResult{}, fmt.Errorf("benchscenario: warm up %s: %w", design, cmp.Or(workErr, err))
		}
	}
	before := probe.Snap()
	if p.OnStart != nil {
		p.OnStart()
	}
	cpu, b0 := StartCPU(ctx, rdb), batches(d)
	start := time.Now()
	var produced sync.WaitGroup
	var sched *schedule
	switch p.Scenario {
	case BurnDown:
		startWork()
	case ProduceAndWork:
		startWork()
		produce(workCtx, &produced, d, p, stamp)
	case BoundedRate:
		sched = &schedule{start: start, rate: p.Rate, lag: make([]time.Duration, p.Ops)}
		pace(workCtx, &produced, d, p, sched, payload)
	}
	select {
	case <-st.all:
	case <-worked:
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	used, batched := cpu.Stop(ctx), batches(d).Sub(b0)
	if p.OnEnd != nil {
		p.OnEnd()
	}
	wire := probe.Snap().Sub(before)
	// Every job has started, so every enqueue has landed; a worker that
	// stopped early stops the producers too.
	stopWork()
	produced.Wait()
	<-worked
	if workErr != nil {
		return WorkResult{}, workErr
	}
	if err := ctx.Err(); err != nil {
		return WorkResult{}, err
	}
	if n := st.handled.Load(); n < int64(p.Ops) {
		return WorkResult{}, fmt.Errorf("benchscenario: %s's worker stopped after %d of %d jobs", design, n, p.Ops)
	}
	r := WorkResult{Design: design, Scenario: p.Scenario, Payload: p.Payload, Slots: p.Slots,
		Tally: Tally{Jobs: int64(p.Ops), Elapsed: elapsed}, Wire: wire, CPU: used, Batches: batched}
	if p.Scenario != BurnDown {
		r.Producers = p.Producers
		r.P50, r.P99, r.P999 = st.percentiles()
	}
	if sched != nil {
		pc := sched.pacing(cmp.Or(p.RateSlack, DefaultRateSlack))
		r.Pacing = &pc
	}
	return r, nil
}

// starts records each job's enqueue-to-start latency from the time
// stamped in its first 8 bytes, and closes all when the ops-th job has
// started.
type starts struct {
	ops     int64
	handled atomic.Int64
	lats    []time.Duration
	all     chan struct{}
	warmed  chan struct{} // receives when the warm-up job has started
}

func newStarts(ops int) *starts {
	return &starts{ops: int64(ops), lats: make([]time.Duration, ops), all: make(chan struct{}), warmed: make(chan struct{}, 1)}
}

// handle is the workers' handler.
func (s *starts) handle(b []byte) {
	if len(b) >= 8 && binary.BigEndian.Uint64(b) == warmUpStamp {
		select {
		case s.warmed <- struct{}{}:
		default:
		}
		return
	}
	n := s.handled.Add(1)
	if n <= s.ops && len(b) >= 8 {
		s.lats[n-1] = time.Duration(time.Now().UnixNano() - int64(binary.BigEndian.Uint64(b)))
	}
	if n == s.ops {
		close(s.all)
	}
}

// percentiles are the p50, p99 and p99.9 latencies, once all have started.
func (s *starts) percentiles() (p50, p99, p999 time.Duration) {
	slices.Sort(s.lats)
	return percentile(s.lats, 0.50), percentile(s.lats, 0.99), percentile(s.lats, 0.999)
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
