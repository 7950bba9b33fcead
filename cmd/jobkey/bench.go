package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/redact"
	"github.com/schollz/progressbar/v3"
)

type benchFlags struct {
	redis      string
	scenarios  string
	payloads   string
	clients    int
	contention string
	duration   time.Duration
	reps       int
	drainOps   int
	full       bool
	matrix     bool // a flag chose the matrix: run it, not the short set
	out        string
	batch      int
	cluster    bool
	workers    bool
	workerJobs int
	workerRate float64 // jobs/s of the bounded-rate worker runs
	replicas   int
	events     bool
	onlyJobkey bool // -min-replicas or -events was given: the other designs have nothing like it
}

// run is one planned measurement.
type runSpec struct {
	design string
	params bench.Params
}

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.redis, "redis", "", "Redis URL, e.g. redis://127.0.0.1:6379/0 (default: $REDIS_URL, else an embedded miniredis)")
	fs.StringVar(&f.scenarios, "scenarios", strings.Join(bench.Scenarios, ","), "scenarios of the matrix (-full)")
	fs.StringVar(&f.payloads, "payloads", "64,1024,16384,262144", "payload sizes in bytes of the matrix (-full)")
	fs.IntVar(&f.clients, "clients", 8, "concurrent clients for the non-contention scenarios")
	fs.StringVar(&f.contention, "contention", "1,4,16,64", "writers/claimers for update-contended and drain, in the matrix (-full)")
	fs.DurationVar(&f.duration, "duration", 0, "how long each timed run lasts (default: 1s; 3s with -full)")
	fs.IntVar(&f.reps, "reps", 1, "repetitions of each run; the report gives the median")
	fs.IntVar(&f.drainOps, "drain-jobs", 0, "jobs the drain scenario pre-enqueues (default: 1000; 3000 with -full)")
	fs.IntVar(&f.batch, "batch", 32, "jobs per call in the batched scenarios")
	fs.BoolVar(&f.full, "full", false, "the whole matrix: every scenario at every payload and contention level (-scenarios, -payloads, -contention choose a part of it)")
	fs.StringVar(&f.out, "out", "report", "folder for report.md, results.json and the charts")
	fs.BoolVar(&f.cluster, "cluster", false, "-redis names a node of a Redis Cluster: report each master's share of keys and commands")
	fs.BoolVar(&f.workers, "workers", false, "also run each design's own worker (jobkey Work, the multi-key worker loop, asynq's Server): burn-down, produce-and-work and bounded-rate")
	fs.IntVar(&f.workerJobs, "worker-jobs", 20000, "jobs per worker run (-workers)")
	fs.Float64Var(&f.workerRate, "worker-rate", defaultWorkerRate, "total enqueue rate in jobs/s of the bounded-rate worker runs (-workers): keep it below every design's burn-down rate, or the latencies measure a backlog")
	fs.BoolVar(&f.events, "events", false, "jobkey's events on (Queue.EnableEvents): every transition appends its event; when given (false too), only jobkey runs, so runs with and without it compare (not with -workers)")
	fs.IntVar(&f.replicas, "min-replicas", 0, "jobkey's Config.MinReplicas: every jobkey write waits for this many replicas of the -redis master; when given (0 too), only jobkey runs, so runs with and without it compare")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "scenarios", "payloads", "contention":
			f.matrix = true
		case "min-replicas", "events":
			f.onlyJobkey = true
		}
	})
	f.matrix = f.matrix || f.full
	if f.duration == 0 {
		f.duration = map[bool]time.Duration{false: time.Second, true: 3 * time.Second}[f.matrix]
	}
	if f.drainOps == 0 {
		f.drainOps = map[bool]int{false: 1000, true: 3000}[f.matrix]
	}
	if err := f.check(); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	specs, err := plan(f)
	if err != nil {
		return err
	}
	url, embedded, stop, err := server(f.redis, stderr)
	if err != nil {
		return err
	}
	defer stop()
	if f.cluster && embedded {
		return fmt.Errorf("-cluster needs -redis: the embedded server is not a cluster")
	}
	if f.replicas > 0 && embedded {
		return fmt.Errorf("-min-replicas needs -redis, a master with replicas: the embedded server has none")
	}
	if err := reachable(ctx, url, embedded); err != nil {
		return err
	}
	if f.onlyJobkey {
		specs = slices.DeleteFunc(specs, func(s runSpec) bool { return s.design != "jobkey" })
	}
	for i := range specs {
		specs[i].params.Cluster = f.cluster
		specs[i].params.MinReplicas = f.replicas
		specs[i].params.Events = f.events
	}

	var works []workSpec
	if f.workers {
		if f.cluster {
			return fmt.Errorf("-workers runs on a single Redis; drop -cluster")
		}
		if f.events {
			return fmt.Errorf("-events runs the scenarios only; drop -workers")
		}
		works = workPlan(f)
		if f.onlyJobkey {
			works = slices.DeleteFunc(works, func(s workSpec) bool { return s.design != "jobkey" })
		}
	}

	results, workResults, err := runPlan(ctx, url, f.reps, specs, works, stderr)
	if err != nil {
		return err
	}
	rep := report{
		Machine:  machine(),
		Server:   serverName(ctx, url, embedded),
		Command:  "jobkey bench " + redact.Text(strings.Join(args, " "), secretURLs(args)...),
		Embedded: embedded,
		RedisCPU: redisReportsCPU(ctx, url),
		Started:  time.Now().UTC().Format(time.RFC3339),
		Results:  results,
		Work:     workResults,
	}
	return rep.write(f.out, stdout, stderr)
}

// runPlan runs every planned measurement reps times against url, behind a
// progress bar, and keeps the median of each.
func runPlan(ctx context.Context, url string, reps int, specs []runSpec, works []workSpec, stderr io.Writer) ([]bench.Result, []bench.WorkResult, error) {
	bar := progressbar.NewOptions((len(specs)+len(works))*reps,
		progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("benchmarking"),
		progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish())
	defer bar.Finish()
	var results []bench.Result
	for _, s := range specs {
		var runs []bench.Result
		for range reps {
			bar.Describe(fmt.Sprintf("%-16s %-8s %7s c=%-2d", s.params.Scenario, s.design, sizeName(s.params.Payload), s.params.Clients))
			r, err := bench.Run(ctx, url, s.design, s.params)
			if err != nil {
				return nil, nil, fmt.Errorf("%s/%s: %w", s.design, s.params.Scenario, err)
			}
			runs = append(runs, r)
			_ = bar.Add(1)
		}
		results = append(results, median(runs))
	}
	var workResults []bench.WorkResult
	for _, s := range works {
		var runs []bench.WorkResult
		for range reps {
			bar.Describe(fmt.Sprintf("%-16s %-10s %d jobs", s.params.Scenario, s.design, s.params.Ops))
			r, err := bench.RunWork(ctx, url, s.design, s.params)
			if err != nil {
				return nil, nil, fmt.Errorf("%s/%s: %w", s.design, s.params.Scenario, err)
			}
			runs = append(runs, r)
			_ = bar.Add(1)
		}
		workResults = append(workResults, medianWork(runs))
	}
	return results, workResults, nil
}

// write prints the report as Markdown and writes report.md, results.json
// and the charts into folder out.
func (rep report) write(out string, stdout, stderr io.Writer) error {
	rep.RateNotKept, rep.WorkersBehind = rateNotKept(rep.Work), workersBehind(rep.Work)
	md := rep.markdown()
	fmt.Fprint(stdout, md)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "results.json"), js, 0o644); err != nil {
		return err
	}
	charts, err := drawCharts(out, rep)
	if err != nil {
		return err
	}
	wrote := append([]string{filepath.Join(out, "report.md"), filepath.Join(out, "results.json")}, charts...)
	fmt.Fprintf(stderr, "wrote %s\n", strings.Join(wrote, ", "))
	return nil
}

// check refuses flags out of range, each with a message saying what it wants.
func (f benchFlags) check() error {
	switch {
	case f.clients < 1 || f.clients > 1024:
		return fmt.Errorf("bench: -clients is %d, want 1..1024", f.clients)
	case f.reps < 1 || f.reps > 100:
		return fmt.Errorf("bench: -reps is %d, want 1..100", f.reps)
	case f.batch < 1 || f.batch > 4096:
		return fmt.Errorf("bench: -batch is %d, want 1..4096", f.batch)
	case f.duration < 100*time.Millisecond:
		return fmt.Errorf("bench: -duration is %v, want at least 100ms (each timed run lasts this long)", f.duration)
	case f.drainOps < 1:
		return fmt.Errorf("bench: -drain-jobs is %d, want at least 1", f.drainOps)
	case f.replicas < 0 || f.replicas > 64:
		return fmt.Errorf("bench: -min-replicas is %d, want 0..64", f.replicas)
	case f.workerJobs < 100 || f.workerJobs > 10_000_000:
		return fmt.Errorf("bench: -worker-jobs is %d, want 100..10000000", f.workerJobs)
	case !(f.workerRate >= 1 && f.workerRate <= 10_000_000):
		return fmt.Errorf("bench: -worker-rate is %v, want 1..10000000 jobs/s", f.workerRate)
	}
	return nil
}

// plan lists the runs: by default a short set that shows the main
// trade-off (enqueue and lifecycle at 1 KiB, the lifecycle at 16 KiB,
// one job updated by 1 and 16 writers, a queue drained by 16 claimers);
// with -full, or when a flag chose scenarios, payloads or contention, the
// matrix of those.
func plan(f benchFlags) ([]runSpec, error) {
	if !f.matrix {
		ps := []bench.Params{
			{Scenario: bench.Enqueue, Payload: 1 << 10, Clients: f.clients, Duration: f.duration},
			{Scenario: bench.Lifecycle, Payload: 1 << 10, Clients: f.clients, Duration: f.duration},
			{Scenario: bench.Lifecycle, Payload: 16 << 10, Clients: f.clients, Duration: f.duration},
			{Scenario: bench.Contended, Payload: 1 << 10, Clients: 1, Duration: f.duration},
			{Scenario: bench.Contended, Payload: 1 << 10, Clients: 16, Duration: f.duration},
			{Scenario: bench.Drain, Payload: 1 << 10, Clients: 16, Ops: f.drainOps},
		}
		var specs []runSpec
		for _, p := range ps {
			for _, d := range designsOf(p.Scenario) {
				specs = append(specs, runSpec{design: d, params: p})
			}
		}
		return specs, nil
	}
	sizes, err := ints(f.payloads)
	if err != nil {
		return nil, fmt.Errorf("-payloads: %w", err)
	}
	levels, err := ints(f.contention)
	if err != nil {
		return nil, fmt.Errorf("-contention: %w", err)
	}
	var specs []runSpec
	for _, sc := range strings.Split(f.scenarios, ",") {
		sc = strings.TrimSpace(sc)
		if !slices.Contains(bench.Scenarios, sc) {
			return nil, fmt.Errorf("unknown scenario %q (have %s)", sc, strings.Join(bench.Scenarios, ", "))
		}
		var ps []bench.Params
		switch sc {
		case bench.Contended:
			for _, n := range levels {
				ps = append(ps, bench.Params{Scenario: sc, Payload: 1 << 10, Clients: n, Duration: f.duration})
			}
		case bench.Drain:
			for _, n := range levels {
				ps = append(ps, bench.Params{Scenario: sc, Payload: 1 << 10, Clients: n, Ops: f.drainOps})
			}
		default:
			for _, size := range sizes {
				ps = append(ps, bench.Params{Scenario: sc, Payload: size, Clients: f.clients, Duration: f.duration, Batch: f.batch})
			}
		}
		for _, p := range ps {
			for _, d := range designsOf(p.Scenario) {
				specs = append(specs, runSpec{design: d, params: p})
			}
		}
	}
	return specs, nil
}

// designsOf lists the designs that run scenario: asynq joins enqueue.
func designsOf(scenario string) []string {
	if scenario == bench.Enqueue {
		return bench.EnqueueDesigns
	}
	return bench.Designs
}

// workSpec is one planned worker run.
type workSpec struct {
	design string
	params bench.WorkParams
}

// defaultWorkerRate is -worker-rate's default, jobs/s, as in
// BenchmarkBoundedRate: about 60% of the slowest design's burn-down rate
// on a 2-core VM (asynq, 8k jobs/s in docs/benchmarks.md), so that the
// workers keep up and the latencies are the pickup's, not a backlog's.
const defaultWorkerRate = 5000

// workerScenarios are the worker scenarios of -workers, in report order.
var workerScenarios = []string{bench.BurnDown, bench.ProduceAndWork, bench.BoundedRate}

// workPlan lists the worker runs of -workers: burn-down, produce-and-work
// and bounded-rate (at -worker-rate), 8 slots (and 8 producers) of every
// worker design.
func workPlan(f benchFlags) []workSpec {
	var out []workSpec
	for _, sc := range workerScenarios {
		for _, d := range bench.WorkerDesigns {
			p := bench.WorkParams{Scenario: sc, Payload: 1 << 10, Slots: 8, Producers: 8, Ops: f.workerJobs, MinReplicas: f.replicas}
			if sc == bench.BoundedRate {
				p.Rate = f.workerRate
			}
			out = append(out, workSpec{design: d, params: p})
		}
	}
	return out
}

// medianWork picks the repetition of a worker run to report: the median by
// p99 latency in bounded-rate, whose throughput is pinned near the rate,
// else the median by throughput.
func medianWork(runs []bench.WorkResult) bench.WorkResult {
	by := func(a, b bench.WorkResult) int { return cmp.Compare(a.Throughput(), b.Throughput()) }
	if runs[0].Scenario == bench.BoundedRate {
		by = func(a, b bench.WorkResult) int { return cmp.Compare(a.P99, b.P99) }
	}
	slices.SortFunc(runs, by)
	return runs[len(runs)/2]
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// median picks the repetition with the median throughput.
func median(rs []bench.Result) bench.Result {
	slices.SortFunc(rs, func(a, b bench.Result) int { return cmp.Compare(a.Throughput(), b.Throughput()) })
	return rs[len(rs)/2]
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func machine() string {
	host, _ := os.Hostname()
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%s: %d cores (%s), %s/%s, %s", host, runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
