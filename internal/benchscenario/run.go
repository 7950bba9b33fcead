package benchscenario

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// The scenarios. In every one an "op" is one job, so per-op figures of
// batched and single scenarios compare directly.
const (
	Enqueue        = "enqueue"          // one job per call
	EnqueueBatch   = "enqueue-batch"    // Batch jobs per call
	Lifecycle      = "lifecycle"        // enqueue, claim, complete
	LifecycleBatch = "lifecycle-batch"  // the same, Batch jobs per call
	Extend         = "extend"           // renew the lease of a claimed job
	Contended      = "update-contended" // Clients writers update one job
	Drain          = "drain"            // Clients claimers drain Ops jobs
)

// Scenarios lists every scenario in report order.
var Scenarios = []string{Enqueue, EnqueueBatch, Lifecycle, LifecycleBatch, Extend, Contended, Drain}

// Params describe one run.
type Params struct {
	Scenario string
	Payload  int // bytes
	Clients  int // concurrent clients, each with its own connection (default 8)
	Batch    int // jobs per batched call (default 32)
	// Ops is how many jobs the timed phase handles; when 0, it runs for
	// Duration instead (drain always needs Ops).
	Ops      int
	Duration time.Duration
	// OnStart is called as the timed phase begins (a benchmark's ResetTimer).
	OnStart func()
	// MinReplicas is jobkey's Config.MinReplicas: every write waits for
	// that many replicas (default 0; other designs ignore it).
	MinReplicas int
	// Events turns jobkey's event stream on (Queue.EnableEvents): every
	// transition appends its event in its own EXEC (other designs ignore
	// it).
	Events bool
	// Cluster treats the URL as a seed node of a Redis Cluster, and reports
	// each master's share of keys and commands.
	Cluster bool
}

// NodeShare is one cluster master's part of a run.
type NodeShare struct {
	Addr     string `json:"addr"`
	Keys     int64  `json:"keys"`     // keys under the run's prefix when the timed phase ended
	Commands int64  `json:"commands"` // commands the node served during the run (INFO commandstats)
}

// Result is what one run measured over its timed phase.
type Result struct {
	Design   string `json:"design"`
	Scenario string `json:"scenario"`
	Payload  int    `json:"payload"`
	Clients  int    `json:"clients"`
	Batch    int    `json:"batch"`
	Tally
	Calls int64         `json:"calls"`  // operation calls (latency samples)
	P50   time.Duration `json:"p50_ns"` // per call
	P99   time.Duration `json:"p99_ns"`
	Wire  Snapshot      `json:"wire"`
	// Conflicts are EXECs aborted by a concurrent write; Retries are
	// attempts beyond the first; Errors are failed calls (ErrConflict
	// give-ups included).
	Conflicts int64 `json:"conflicts"`
	Retries   int64 `json:"retries"`
	Errors    int64 `json:"errors"`
	// CPU is what the client process and Redis spent over the timed phase.
	CPU CPU `json:"cpu"`
	// Batches are the sizes of jobkey's group-committed batches.
	Batches jobkey.BatchSizes `json:"batches"`
	// Nodes is filled on a cluster: each master's keys and commands.
	Nodes []NodeShare `json:"nodes,omitempty"`
}

// Tally is what every run counts: the jobs handled and the time they took.
// Result and WorkResult embed it, and share its methods.
type Tally struct {
	Jobs    int64         `json:"jobs"` // jobs handled
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Throughput is jobs per second.
func (t Tally) Throughput() float64 {
	if t.Elapsed <= 0 {
		return 0
	}
	return float64(t.Jobs) / t.Elapsed.Seconds()
}

// Per divides a counter by the jobs handled.
func (t Tally) Per(n int64) float64 {
	if t.Jobs == 0 {
		return 0
	}
	return float64(n) / float64(t.Jobs)
}

// Run runs one scenario of one of Designs against the Redis at url, under
// a fresh key prefix that it deletes afterwards.
func Run(ctx context.Context, url, design string, p Params) (Result, error) {
	return RunWith(ctx, url, design, p, NewDesign)
}

// RunWith is Run with the designs that newDesign builds.
func RunWith(ctx context.Context, url, design string, p Params, newDesign Factory) (Result, error) {
	p.Clients = cmp.Or(p.Clients, 8)
	p.Batch = cmp.Or(p.Batch, 32)
	if p.Ops == 0 && (p.Duration <= 0 || p.Scenario == Drain) {
		return Result{}, fmt.Errorf("benchscenario: %s needs Ops", p.Scenario)
	}
	probe := &Probe{}
	var rdb redis.UniversalClient
	var err error
	if p.Cluster {
		rdb, err = ClusterClient(url, probe, 2*p.Clients+4)
	} else {
		rdb, err = Client(url, probe, 2*p.Clients+4)
	}
	if err != nil {
		return Result{}, err
	}
	defer rdb.Close()
	prefix := "bench-" + jobkey.NewID()
	defer Cleanup(context.WithoutCancel(ctx), rdb, prefix)
	calls0 := nodeCalls(ctx, rdb)
	d, err := newDesign(design, rdb, prefix, p.MinReplicas)
	if err != nil {
		return Result{}, err
	}
	if c, ok := d.(interface{ Close() }); ok {
		defer c.Close()
	}
	if jk, ok := d.(*Jobkey); ok && p.Events {
		if err := jk.Q.EnableEvents(ctx); err != nil {
			return Result{}, fmt.Errorf("benchscenario: events on: %w", err)
		}
	}
	op, err := setup(ctx, d, p)
	if err != nil {
		return Result{}, fmt.Errorf("benchscenario: set up %s/%s: %w", design, p.Scenario, err)
	}

	var next, jobs, errs atomic.Int64
	lats := make([][]time.Duration, p.Clients)
	var deadline time.Time
	before, c0, r0 := probe.Snap(), d.Conflicts(), d.Retries()
	if p.OnStart != nil {
		p.OnStart()
	}
	cpu, b0 := StartCPU(ctx, rdb), batches(d)
	start := time.Now()
	if p.Ops == 0 {
		deadline = start.Add(p.Duration)
	}
	var wg sync.WaitGroup
	for c := range p.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if p.Ops > 0 && next.Load() >= int64(p.Ops) {
					return
				}
				if p.Ops == 0 && time.Now().After(deadline) {
					return
				}
				want := min(int64(p.Batch), max(1, int64(p.Ops)-next.Load()))
				if p.Ops == 0 {
					want = int64(p.Batch)
				}
				t0 := time.Now()
				n, err := op(ctx, c, int(want))
				lats[c] = append(lats[c], time.Since(t0))
				next.Add(int64(max(n, 1)))
				jobs.Add(int64(n))
				if errors.Is(err, ErrEmpty) {
					return // drained
				}
				if err != nil {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	used := cpu.Stop(ctx)
	all := slices.Concat(lats...)
	slices.Sort(all)
	r := Result{
		Design: design, Scenario: p.Scenario, Payload: p.Payload, Clients: p.Clients, Batch: p.Batch,
		Tally: Tally{Jobs: jobs.Load(), Elapsed: elapsed}, Calls: int64(len(all)), Wire: probe.Snap().Sub(before),
		Conflicts: d.Conflicts() - c0, Retries: d.Retries() - r0, Errors: errs.Load(),
		P50: percentile(all, 0.50), P99: percentile(all, 0.99), CPU: used,
		Batches: batches(d).Sub(b0),
	}
	if p.Cluster {
		r.Nodes = nodeShares(ctx, rdb, prefix, calls0)
	}
	return r, nil
}

// nodeCalls sums INFO commandstats calls per master of a cluster.
func nodeCalls(ctx context.Context, rdb redis.UniversalClient) map[string]int64 {
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	var mu sync.Mutex
	out := map[string]int64{}
	_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var total int64
		for _, line := range strings.Split(info, "\n") {
			if _, rest, ok := strings.Cut(line, "calls="); ok {
				v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				total += v
			}
		}
		mu.Lock()
		out[n.Options().Addr] = total
		mu.Unlock()
		return nil
	})
	return out
}

// nodeShares counts each master's keys under prefix and commands since before.
func nodeShares(ctx context.Context, rdb redis.UniversalClient, prefix string, before map[string]int64) []NodeShare {
	c := rdb.(*redis.ClusterClient)
	after := nodeCalls(ctx, rdb)
	var mu sync.Mutex
	var out []NodeShare
	_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		var keys int64
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys++
		}
		addr := n.Options().Addr
		mu.Lock()
		out = append(out, NodeShare{Addr: addr, Keys: keys, Commands: after[addr] - before[addr]})
		mu.Unlock()
		return iter.Err()
	})
	slices.SortFunc(out, func(a, b NodeShare) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// opFunc runs one call for client c handling up to want jobs, and returns
// how many jobs it handled.
type opFunc func(ctx context.Context, c, want int) (int, error)

func payload(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func setup(ctx context.Context, d Design, p Params) (opFunc, error) {
	pl := payload(p.Payload)
	batchOf := func(n int) [][]byte {
		b := make([][]byte, n)
		for i := range b {
			b[i] = pl
		}
		return b
	}
	switch p.Scenario {
	case Enqueue:
		return func(ctx context.Context, _, _ int) (int, error) { return 1, d.Enqueue(ctx, pl) }, nil
	case EnqueueBatch:
		return func(ctx context.Context, _, want int) (int, error) { return want, d.EnqueueBatch(ctx, batchOf(want)) }, nil
	case Lifecycle:
		return func(ctx context.Context, c, _ int) (int, error) {
			if err := d.Enqueue(ctx, pl); err != nil {
				return 0, err
			}
			h, err := claimOne(ctx, d, worker(c))
			if err != nil {
				return 0, err
			}
			return 1, d.Complete(ctx, h, nil)
		}, nil
	case LifecycleBatch:
		return func(ctx context.Context, c, want int) (int, error) {
			if err := d.EnqueueBatch(ctx, batchOf(want)); err != nil {
				return 0, err
			}
			hs, err := d.ClaimMany(ctx, worker(c), want)
			if errors.Is(err, ErrEmpty) {
				return 0, nil // other clients took them; they count there
			}
			if err != nil {
				return 0, err
			}
			return len(hs), d.CompleteMany(ctx, hs)
		}, nil
	case Extend:
		held := make([]Handle, p.Clients)
		for c := range held {
			if err := d.Enqueue(ctx, pl); err != nil {
				return nil, err
			}
			h, err := claimOne(ctx, d, worker(c))
			if err != nil {
				return nil, err
			}
			held[c] = h
		}
		return func(ctx context.Context, c, _ int) (int, error) {
			h, err := d.Extend(ctx, held[c])
			if err == nil {
				held[c] = h
			}
			return 1, err
		}, nil
	case Contended:
		if err := d.Put(ctx, "hot", pl); err != nil {
			return nil, err
		}
		return func(ctx context.Context, _, _ int) (int, error) { return 1, d.Update(ctx, "hot", pl) }, nil
	case Drain:
		for left := p.Ops; left > 0; left -= 256 {
			if err := d.EnqueueBatch(ctx, batchOf(min(left, 256))); err != nil {
				return nil, err
			}
		}
		return func(ctx context.Context, c, _ int) (int, error) {
			h, err := d.Claim(ctx, worker(c))
			if err != nil {
				return 0, err
			}
			return 1, d.Complete(ctx, h, nil)
		}, nil
	}
	return nil, fmt.Errorf("benchscenario: unknown scenario %q", p.Scenario)
}

func worker(c int) string { return fmt.Sprintf("bench-worker-%d", c) }

// claimOne claims a job, retrying while other clients hold the ones due.
func claimOne(ctx context.Context, d Design, w string) (Handle, error) {
	for i := 0; ; i++ {
		h, err := d.Claim(ctx, w)
		if !errors.Is(err, ErrEmpty) || i == 100 {
			return h, err
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Cleanup deletes every key under prefix, on every master of a cluster.
func Cleanup(ctx context.Context, rdb redis.UniversalClient, prefix string) {
	clean := func(ctx context.Context, n *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := n.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			// One UNLINK per key (a cluster node's keys span slots), one
			// round trip per SCAN page.
			_, _ = n.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, clean)
	case *redis.Client:
		_ = clean(ctx, c)
	}
}
