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

	"github.com/jobkey/jobkey/internal/bench"
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
	quick      bool
	out        string
	batch      int
	cluster    bool
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
	fs.StringVar(&f.scenarios, "scenarios", strings.Join(bench.Scenarios, ","), "scenarios to run")
	fs.StringVar(&f.payloads, "payloads", "64,1024,16384,262144", "payload sizes in bytes")
	fs.IntVar(&f.clients, "clients", 8, "concurrent clients for the non-contention scenarios")
	fs.StringVar(&f.contention, "contention", "1,4,16,64", "writers/claimers for update-contended and drain")
	fs.DurationVar(&f.duration, "duration", 3*time.Second, "how long each timed run lasts")
	fs.IntVar(&f.reps, "reps", 1, "repetitions of each run; the report gives the median")
	fs.IntVar(&f.drainOps, "drain-jobs", 3000, "jobs the drain scenario pre-enqueues")
	fs.IntVar(&f.batch, "batch", 32, "jobs per call in the batched scenarios")
	fs.BoolVar(&f.quick, "quick", false, "a short run (within 60 s): 1 KiB and 16 KiB payloads, contention 1 and 16, 1 s runs")
	fs.StringVar(&f.out, "out", "report", "folder for report.md, results.json and the charts")
	fs.BoolVar(&f.cluster, "cluster", false, "-redis names a node of a Redis Cluster: report each master's share of keys and commands")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.quick {
		f.payloads, f.contention, f.duration, f.drainOps, f.reps = "1024,16384", "1,16", time.Second, 1000, 1
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
	for i := range specs {
		specs[i].params.Cluster = f.cluster
	}

	bar := progressbar.NewOptions(len(specs)*f.reps,
		progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("benchmarking"),
		progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish())
	var results []bench.Result
	for _, s := range specs {
		var reps []bench.Result
		for range f.reps {
			bar.Describe(fmt.Sprintf("%-16s %-8s %7s c=%-2d", s.params.Scenario, s.design, sizeName(s.params.Payload), s.params.Clients))
			r, err := bench.Run(ctx, url, s.design, s.params)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", s.design, s.params.Scenario, err)
			}
			reps = append(reps, r)
			_ = bar.Add(1)
		}
		results = append(results, median(reps))
	}
	_ = bar.Finish()

	rep := report{
		Machine:  machine(),
		Server:   serverName(ctx, url, embedded),
		Command:  "jobkey bench " + strings.Join(args, " "),
		Embedded: embedded,
		Started:  time.Now().UTC().Format(time.RFC3339),
		Results:  results,
	}
	md := rep.markdown()
	fmt.Fprint(stdout, md)
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(f.out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(f.out, "results.json"), js, 0o644); err != nil {
		return err
	}
	charts, err := drawCharts(f.out, results)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s, %s and %s\n", filepath.Join(f.out, "report.md"), filepath.Join(f.out, "results.json"), strings.Join(charts, ", "))
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
	}
	return nil
}

func plan(f benchFlags) ([]runSpec, error) {
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
			for _, d := range bench.Designs {
				specs = append(specs, runSpec{design: d, params: p})
			}
		}
	}
	return specs, nil
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
