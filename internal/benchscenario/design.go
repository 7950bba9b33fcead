// Package benchscenario holds the benchmark scenarios that compare jobkey
// with the multi-key design. The root module's bench_test.go, the bench
// module (which adds asynq) and `jobkey bench` all run them, so the figures
// in the README and the ones a reader reproduces come from the same code.
package benchscenario

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/multikey"
	"github.com/redis/go-redis/v9"
)

// ErrEmpty reports that a claim found nothing.
var ErrEmpty = errors.New("benchscenario: queue empty")

// Handle is a claimed job, opaque to the scenarios.
type Handle any

// Design is the small interface both queue designs implement for the
// scenarios.
type Design interface {
	Name() string
	Enqueue(ctx context.Context, payload []byte) error
	EnqueueBatch(ctx context.Context, payloads [][]byte) error
	Claim(ctx context.Context, worker string) (Handle, error)
	ClaimMany(ctx context.Context, worker string, n int) ([]Handle, error)
	Extend(ctx context.Context, h Handle) (Handle, error)
	Complete(ctx context.Context, h Handle, result []byte) error
	CompleteMany(ctx context.Context, hs []Handle) error
	// Put creates a job with a known ID; Update rewrites its payload.
	Put(ctx context.Context, id string, payload []byte) error
	Update(ctx context.Context, id string, payload []byte) error
	// Conflicts and Retries count compare-and-set collisions (0 for
	// designs without them).
	Conflicts() int64
	Retries() int64
}

// Jobkey adapts a jobkey.Queue.
type Jobkey struct {
	Q *jobkey.Queue
	// GaveUp counts operations that returned ErrConflict.
	GaveUp atomic.Int64
}

// NewJobkey returns the jobkey design under prefix; its writes wait for
// minReplicas replicas (jobkey.Config.MinReplicas).
func NewJobkey(rdb redis.UniversalClient, prefix string, minReplicas int) (*Jobkey, error) {
	// The eviction check is skipped: the embedded server cannot answer it,
	// and a benchmark's queue lives for seconds.
	q, err := jobkey.NewQueue(rdb, "bench", &jobkey.Config{Prefix: prefix, MaxValueBytes: jobkey.MaxValueBytes, MaxBatch: 512,
		SkipEvictionCheck: true, MinReplicas: minReplicas})
	if err != nil {
		return nil, err
	}
	return &Jobkey{Q: q}, nil
}

func (d *Jobkey) Name() string { return "jobkey" }

func (d *Jobkey) Enqueue(ctx context.Context, payload []byte) error {
	_, err := d.Q.Enqueue(ctx, "bench", payload, nil)
	return d.count(err)
}

func (d *Jobkey) EnqueueBatch(ctx context.Context, payloads [][]byte) error {
	batch := make([]jobkey.JobSpec, len(payloads))
	for i, p := range payloads {
		batch[i] = jobkey.JobSpec{Type: "bench", Payload: p}
	}
	_, err := d.Q.EnqueueMany(ctx, batch)
	return d.count(err)
}

func (d *Jobkey) Claim(ctx context.Context, worker string) (Handle, error) {
	j, err := d.Q.Claim(ctx, worker)
	if errors.Is(err, jobkey.ErrNoJob) {
		return nil, ErrEmpty
	}
	return j, d.count(err)
}

func (d *Jobkey) ClaimMany(ctx context.Context, worker string, n int) ([]Handle, error) {
	js, err := d.Q.ClaimMany(ctx, worker, n)
	if errors.Is(err, jobkey.ErrNoJob) {
		return nil, ErrEmpty
	}
	hs := make([]Handle, len(js))
	for i, j := range js {
		hs[i] = j
	}
	return hs, d.count(err)
}

func (d *Jobkey) Extend(ctx context.Context, h Handle) (Handle, error) {
	j, err := d.Q.Extend(ctx, h.(*jobkey.Job))
	return j, d.count(err)
}

func (d *Jobkey) Complete(ctx context.Context, h Handle, result []byte) error {
	_, err := d.Q.Complete(ctx, h.(*jobkey.Job), result)
	return d.count(err)
}

func (d *Jobkey) CompleteMany(ctx context.Context, hs []Handle) error {
	js := make([]*jobkey.Job, len(hs))
	for i, h := range hs {
		js[i] = h.(*jobkey.Job)
	}
	_, err := d.Q.CompleteMany(ctx, js, nil)
	return d.count(err)
}

func (d *Jobkey) Put(ctx context.Context, id string, payload []byte) error {
	_, err := d.Q.Enqueue(ctx, "bench", payload, &jobkey.EnqueueOpts{ID: id})
	return err
}

func (d *Jobkey) Update(ctx context.Context, id string, payload []byte) error {
	_, err := d.Q.Update(ctx, id, func(j *jobkey.Job) error { j.Payload = payload; return nil })
	return d.count(err)
}

func (d *Jobkey) Conflicts() int64 { return d.Q.Metrics().Conflicts }

// Batches sums the batch sizes of every group-committed call.
func (d *Jobkey) Batches() jobkey.BatchSizes {
	m := d.Q.Metrics()
	var s jobkey.BatchSizes
	for _, h := range []jobkey.BatchSizes{m.EnqueueBatches, m.ClaimBatches, m.CompleteBatches, m.ExtendBatches, m.FinishBatches} {
		s.Flushes += h.Flushes
		s.Calls += h.Calls
		for i := range s.Buckets {
			s.Buckets[i] += h.Buckets[i]
		}
	}
	return s
}

// batcher is a design that counts its batches.
type batcher interface{ Batches() jobkey.BatchSizes }

// batches reads d's batch sizes, if it counts them.
func batches(d any) jobkey.BatchSizes {
	if b, ok := d.(batcher); ok {
		return b.Batches()
	}
	return jobkey.BatchSizes{}
}

// Retries counts attempts beyond the first of each transaction.
func (d *Jobkey) Retries() int64 { m := d.Q.Metrics(); return m.Attempts - m.Txns }

// count tallies give-ups; they are errors the scenario reports, not crashes.
func (d *Jobkey) count(err error) error {
	if errors.Is(err, jobkey.ErrConflict) {
		d.GaveUp.Add(1)
	}
	return err
}

// Multikey adapts the multi-key baseline.
type Multikey struct {
	Q *multikey.Queue
}

// NewMultikey returns the multi-key design under prefix.
func NewMultikey(rdb redis.UniversalClient, prefix string) *Multikey {
	return &Multikey{Q: multikey.New(rdb, prefix, "bench")}
}

func (d *Multikey) Name() string { return "multikey" }

// id makes unique IDs as cheaply as jobkey's ULIDs, so ID generation does
// not tilt the comparison.
func (d *Multikey) id() string { return jobkey.NewID() }

func (d *Multikey) Enqueue(ctx context.Context, payload []byte) error {
	_, err := d.Q.Enqueue(ctx, d.id(), payload)
	return err
}

func (d *Multikey) EnqueueBatch(ctx context.Context, payloads [][]byte) error {
	ids := make([]string, len(payloads))
	for i := range ids {
		ids[i] = d.id()
	}
	return d.Q.EnqueueBatch(ctx, ids, payloads)
}

func (d *Multikey) Claim(ctx context.Context, worker string) (Handle, error) {
	j, err := d.Q.Claim(ctx, worker)
	if errors.Is(err, multikey.ErrNoJob) {
		return nil, ErrEmpty
	}
	return j, err
}

func (d *Multikey) ClaimMany(ctx context.Context, worker string, n int) ([]Handle, error) {
	js, err := d.Q.ClaimMany(ctx, worker, n)
	if errors.Is(err, multikey.ErrNoJob) {
		return nil, ErrEmpty
	}
	hs := make([]Handle, len(js))
	for i, j := range js {
		hs[i] = j
	}
	return hs, err
}

func (d *Multikey) Extend(ctx context.Context, h Handle) (Handle, error) {
	return h, d.Q.Extend(ctx, h.(*multikey.Job))
}

func (d *Multikey) Complete(ctx context.Context, h Handle, result []byte) error {
	return d.Q.Complete(ctx, h.(*multikey.Job), result)
}

func (d *Multikey) CompleteMany(ctx context.Context, hs []Handle) error {
	js := make([]*multikey.Job, len(hs))
	for i, h := range hs {
		js[i] = h.(*multikey.Job)
	}
	return d.Q.CompleteMany(ctx, js, make([][]byte, len(js)))
}

func (d *Multikey) Put(ctx context.Context, id string, payload []byte) error {
	_, err := d.Q.Enqueue(ctx, id, payload)
	return err
}

func (d *Multikey) Update(ctx context.Context, id string, payload []byte) error {
	return d.Q.Update(ctx, id, payload)
}

func (d *Multikey) Conflicts() int64 { return 0 }
func (d *Multikey) Retries() int64   { return 0 }

// Designs lists the design names every scenario knows.
var Designs = []string{"jobkey", "multikey"}

// Factory builds a design by name on rdb under prefix; minReplicas is
// jobkey's Config.MinReplicas, which the other designs have nothing like.
// A design that also has a Close method is closed when its run ends,
// before rdb is.
type Factory func(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (Design, error)

// NewDesign builds one of Designs by name.
func NewDesign(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (Design, error) {
	switch name {
	case "jobkey":
		return NewJobkey(rdb, prefix, minReplicas)
	case "multikey":
		return NewMultikey(rdb, prefix), nil
	}
	return nil, fmt.Errorf("benchscenario: unknown design %q", name)
}
