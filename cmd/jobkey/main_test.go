package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The demo reproduces the failing group (docs/design.md, section 1) on real Redis and shows
// jobkey refusing the same fault.
func TestDemo(t *testing.T) {
	url := redistest.RequireReal(t).URL
	var out, errOut bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"demo", "-redis", url}, &out, &errOut))
	s := out.String()
	require.Contains(t, s, "one result per step -> [ok, error, ok]")
	require.Contains(t, s, "count = 1, includes the invisible job")
	require.Contains(t, s, "record present")
	require.Contains(t, s, "no record written; ready unchanged")
	require.Contains(t, s, "nothing was written")
	require.Contains(t, s, "5 enqueued, claimed and completed")
	require.NotContains(t, s, "RECORD PRESENT")
}

func TestBenchWritesReport(t *testing.T) {
	url := redistest.RequireReal(t).URL
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "-redis", url, "-scenarios", "lifecycle,update-contended,drain",
		"-payloads", "64,1024", "-contention", "2", "-duration", "150ms", "-drain-jobs", "50", "-out", dir}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	require.Contains(t, out.String(), "## lifecycle")
	require.Contains(t, out.String(), "| 1KiB | 8 | jobkey |")
	require.Contains(t, out.String(), "Redis 7")
	require.Contains(t, out.String(), "| client µs/job | Redis µs/job | allocs/job |")
	require.NotContains(t, out.String(), "n/a", "Redis reports its CPU")
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	var rep struct {
		RedisCPU bool `json:"redis_cpu"`
		Results  []bench.Result
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.True(t, rep.RedisCPU)
	require.Len(t, rep.Results, 8) // (2 payloads + 1 + 1) × 2 designs
	for _, r := range rep.Results {
		require.Positive(t, r.Jobs, "%s/%s", r.Design, r.Scenario)
		require.Zero(t, r.Errors, "%s/%s", r.Design, r.Scenario)
		require.Positive(t, r.CPU.Client, "%s/%s", r.Design, r.Scenario)
		require.Positive(t, r.CPU.Redis, "%s/%s", r.Design, r.Scenario)
	}
	for _, chart := range []string{"throughput-vs-payload.svg", "bytes-per-lifecycle.svg", "conflicts-vs-contention.svg", "conflicts-vs-claimers.svg", cpuChartFile} {
		require.Contains(t, textsOf(svgElements(t, filepath.Join(dir, chart))), "jobkey", "%s: a well-formed chart with its legend", chart)
	}
}

// -workers runs every design's own worker, and asynq joins enqueue: all
// in one report.
func TestBenchWorkers(t *testing.T) {
	url := redistest.RequireReal(t).URL
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "-redis", url, "-scenarios", "enqueue", "-payloads", "1024",
		"-duration", "150ms", "-workers", "-worker-jobs", "300", "-worker-rate", "500", "-out", dir}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	s := out.String()
	require.Contains(t, s, "| 1KiB | 8 | asynq |")
	require.Contains(t, s, "## workers: burn-down")
	require.Contains(t, s, "## workers: produce-and-work")
	require.Contains(t, s, "| asynq-fast | 300 |")
	require.Contains(t, s, "## workers: bounded-rate")
	require.Contains(t, s, "| p50 | p99 | p99.9 | lag p99 | lag max | end lag | rate kept |")
	require.Regexp(t, `\| asynq-fast \| 300 \| 500 \| [0-9]+ \|`, s, "the bounded-rate row, at -worker-rate")
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	var rep struct {
		Results []bench.Result
		Work    []bench.WorkResult
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, 3, "enqueue × jobkey, multikey, asynq")
	require.Len(t, rep.Work, 12, "3 scenarios × 4 worker designs")
	bounded := 0
	for _, r := range rep.Work {
		require.EqualValues(t, 300, r.Jobs, "%s/%s", r.Design, r.Scenario)
		require.Positive(t, r.Throughput(), "%s/%s", r.Design, r.Scenario)
		if r.Scenario == bench.BoundedRate {
			bounded++
			require.NotNil(t, r.Pacing, r.Design)
			require.InDelta(t, 500, r.Pacing.Rate, 0, r.Design)
			require.Positive(t, r.P999, r.Design)
		}
	}
	require.Equal(t, 4, bounded, "bounded-rate for every worker design")
	require.Contains(t, cpuGroupLabels(cpuGroups(nil, rep.Work)), "bounded-rate 1KiB 8 slots 500/s", "the CPU chart draws it")
	require.Error(t, run(context.Background(), []string{"bench", "-redis", url, "-workers", "-worker-jobs", "5"}, &out, &errOut))
}

// With no URL, bench runs on the embedded miniredis (the README's first
// command): it has no INFO cpu, so Redis's CPU per job is n/a, not 0, and
// the CPU chart draws the client's alone.
func TestBenchOnTheEmbeddedServerSaysRedisCPUIsNA(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "-scenarios", "enqueue,lifecycle", "-payloads", "1024",
		"-duration", "100ms", "-out", dir}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	s := out.String()
	require.Contains(t, s, "embedded miniredis")
	require.Contains(t, s, "Redis µs/job is n/a")
	require.Regexp(t, `\| 1KiB \| 8 \| asynq \|( [^|]* \|){7} [0-9.]+ \| n/a \| [0-9]+ \|`, s, "client CPU, n/a, allocs")
	require.Regexp(t, `\| 1KiB \| 8 \| jobkey \|( [^|]* \|){7} [0-9.]+ \| n/a \| [0-9]+ \|`, s)
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	var rep struct {
		RedisCPU bool `json:"redis_cpu"`
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.False(t, rep.RedisCPU)
	width := barWidths(t, filepath.Join(dir, cpuChartFile))
	require.Positive(t, width[designColor["asynq"]])
	require.Zero(t, width[lighter(designColor["jobkey"])], "no Redis share drawn")
}

// With no URL the command says plainly that it runs on miniredis.
func TestEmbeddedServerIsNamed(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"demo"}, &out, &errOut))
	require.Contains(t, errOut.String(), "NOT Redis timings")
	require.True(t, strings.Contains(out.String(), "[ok, error, ok]"))
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Error(t, run(context.Background(), nil, &out, &errOut))
	require.Error(t, run(context.Background(), []string{"nope"}, &out, &errOut))
	require.Error(t, run(context.Background(), []string{"bench", "-scenarios", "nope"}, &out, &errOut))
	require.Error(t, run(context.Background(), []string{"stats"}, &out, &errOut))
}

func TestVerifyAndStats(t *testing.T) {
	// Four shards: the command learns the count from Redis, so its figures
	// cover every shard without being told.
	f := newFixture(t, 4)
	ctx, rdb, q, url, prefix := f.ctx, f.rdb, f.q, f.url, f.prefix
	var err error
	var ids []string
	for range 8 {
		j, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	args := []string{"-redis", url, "-queue", "mail", "-prefix", prefix}

	var out, errOut bytes.Buffer
	require.NoError(t, run(ctx, append([]string{"stats"}, args...), &out, &errOut))
	require.Contains(t, out.String(), "| mail | 8 | 8 | 0 |")
	out.Reset()
	require.NoError(t, run(ctx, append([]string{"verify"}, args...), &out, &errOut))
	require.Contains(t, out.String(), "no findings")

	// A job moved to the wrong index on whichever shard holds it.
	for _, id := range ids {
		require.NoError(t, rdb.ZRem(ctx, q.Keys(id).Ready, id).Err())
		require.NoError(t, rdb.ZAdd(ctx, q.Keys(id).Failed, redis.Z{Score: 1, Member: id}).Err())
	}
	out.Reset()
	err = run(ctx, append([]string{"verify"}, args...), &out, &errOut)
	require.ErrorIs(t, err, errFindings, "a finding exits non-zero")
	for _, id := range ids {
		require.Contains(t, out.String(), "| "+id+" | wrong-entry |")
	}
	out.Reset()
	require.NoError(t, run(ctx, append([]string{"verify", "-fix"}, args...), &out, &errOut), "everything was repaired")
	require.Contains(t, out.String(), "| true |")
	out.Reset()
	require.NoError(t, run(ctx, append([]string{"verify"}, args...), &out, &errOut))
	require.Contains(t, out.String(), "no findings")

	// A value no index lists is found only by -keys, which walks the
	// database.
	require.NoError(t, rdb.ZRem(ctx, q.Keys(ids[0]).Ready, ids[0]).Err())
	out.Reset()
	require.NoError(t, run(ctx, append([]string{"verify"}, args...), &out, &errOut))
	out.Reset()
	require.ErrorIs(t, run(ctx, append([]string{"verify", "-keys"}, args...), &out, &errOut), errFindings)
	require.Contains(t, out.String(), "| "+ids[0]+" | missing-entry |")
}

// stats and verify inspect a live queue: never an empty embedded server,
// never a queue that does not exist, and an unreachable Redis is one line.
func TestInspectRefusesWhatWouldLookClear(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	ctx := context.Background()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"stats", "-queue", "mail"}, &out, &errOut)
	require.ErrorContains(t, err, "-redis (or REDIS_URL) is required")
	err = run(ctx, []string{"verify", "-queue", "mail"}, &out, &errOut)
	require.ErrorContains(t, err, "-redis (or REDIS_URL) is required")

	url := redistest.RequireReal(t).URL
	err = run(ctx, []string{"stats", "-redis", url, "-queue", "never-made", "-prefix", redistest.Prefix(t)}, &out, &errOut)
	require.ErrorIs(t, err, jobkey.ErrNotFound)

	t0 := time.Now()
	err = run(ctx, []string{"stats", "-redis", "redis://127.0.0.1:1", "-queue", "mail"}, &out, &errOut)
	require.ErrorContains(t, err, "Redis at 127.0.0.1:1 could not be reached")
	require.ErrorIs(t, err, jobkey.ErrUnreachable)
	require.Less(t, time.Since(t0), 5*time.Second)
	require.NotContains(t, oneLine(errors.New("a\nb")), "\n")
	require.Equal(t, "jobkey: x", oneLine(errors.New("jobkey: x")), "prefixed once")
	require.Equal(t, "jobkey: plain", oneLine(errors.New("plain")))
}

// Flags out of range are refused with a message, never a panic.
func TestBenchRefusesBadFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"-clients", "-5"}, {"-clients", "0"}, {"-reps", "0"}, {"-batch", "-1"}, {"-duration", "0"},
		{"-payloads", "0"}, {"-contention", "x"}, {"extra"}, {"-worker-rate", "0"}, {"-worker-rate", "-5"}, {"-worker-rate", "NaN"},
		{"-worker-rate", "+Inf"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"bench", "-redis", "redis://127.0.0.1:1"}, bad...), &out, &errOut)
		require.Error(t, err, "%v", bad)
	}
}

// jobkey bench -cluster runs on a real 3-master cluster and reports each
// master's share of keys and commands.
func TestBenchOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "-cluster", "-redis", "redis://" + cl.Addrs()[0],
		"-scenarios", "lifecycle", "-payloads", "1024", "-duration", "500ms", "-out", t.TempDir()}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	s := out.String()
	require.Contains(t, s, "## cluster: each master's share")
	for _, a := range cl.Addrs() {
		require.Contains(t, s, "| lifecycle | 1KiB | jobkey | "+a+" |")
	}
}

// -workers runs burn-down, produce-and-work and bounded-rate for every
// worker design, bounded-rate at -worker-rate (default 5000 jobs/s).
func TestBenchWorkerPlanRunsBoundedRateAtTheWorkerRate(t *testing.T) {
	works := workPlan(benchFlags{workerJobs: 1000, workerRate: 750})
	require.Len(t, works, 3*len(bench.WorkerDesigns))
	for _, d := range bench.WorkerDesigns {
		require.Contains(t, works, workSpec{design: d, params: bench.WorkParams{Scenario: bench.BoundedRate, Payload: 1 << 10,
			Slots: 8, Producers: 8, Ops: 1000, Rate: 750}})
		require.Contains(t, works, workSpec{design: d, params: bench.WorkParams{Scenario: bench.ProduceAndWork, Payload: 1 << 10,
			Slots: 8, Producers: 8, Ops: 1000}}, "the other scenarios have no rate")
	}
	var out, errOut bytes.Buffer
	_ = run(context.Background(), []string{"bench", "-h"}, &out, &errOut)
	require.Regexp(t, `-worker-rate value\n.*\(default 5000\)`, errOut.String())
}

// A bounded-rate run's throughput is pinned near the rate, so the median
// repetition is picked by p99; the other worker scenarios' by throughput.
func TestMedianWorkRunIsByP99InBoundedRate(t *testing.T) {
	run := func(sc string, jobs int64, p99 time.Duration) bench.WorkResult {
		return bench.WorkResult{Scenario: sc, Tally: bench.Tally{Jobs: jobs, Elapsed: time.Second}, P99: p99}
	}
	got := medianWork([]bench.WorkResult{run(bench.BoundedRate, 4990, 9*time.Millisecond),
		run(bench.BoundedRate, 5000, time.Millisecond), run(bench.BoundedRate, 4980, 3*time.Millisecond)})
	require.Equal(t, 3*time.Millisecond, got.P99)
	got = medianWork([]bench.WorkResult{run(bench.ProduceAndWork, 4990, 9*time.Millisecond),
		run(bench.ProduceAndWork, 5000, time.Millisecond), run(bench.ProduceAndWork, 4980, 3*time.Millisecond)})
	require.EqualValues(t, 4990, got.Jobs)
}

// With no flags, bench runs a short set that shows the main trade-off, so
// a newcomer's first command answers within a minute; -full, or a flag
// that names scenarios, payloads or contention, runs the matrix.
func TestBenchDefaultPlanIsShort(t *testing.T) {
	specs, err := plan(benchFlags{clients: 8, duration: time.Second, drainOps: 1000})
	require.NoError(t, err)
	require.Len(t, specs, 13, "six measurements, each for both designs, and asynq's enqueue")
	var names []string
	for _, s := range specs {
		names = append(names, fmt.Sprintf("%s/%s/%d", s.params.Scenario, sizeName(s.params.Payload), s.params.Clients))
	}
	require.Contains(t, specs, runSpec{design: "asynq", params: bench.Params{Scenario: bench.Enqueue, Payload: 1 << 10, Clients: 8, Duration: time.Second}})
	for _, want := range []string{"enqueue/1KiB/8", "lifecycle/1KiB/8", "lifecycle/16KiB/8", "update-contended/1KiB/16", "drain/1KiB/16"} {
		require.Contains(t, names, want)
	}
	full, err := plan(benchFlags{matrix: true, scenarios: strings.Join(bench.Scenarios, ","), payloads: "64,1024,16384,262144",
		contention: "1,4,16,64", clients: 8, duration: time.Second, drainOps: 1000})
	require.NoError(t, err)
	require.Len(t, full, 2*(5*4+2*4)+4, "the whole matrix: five scenarios at four payloads, two at four contention levels, asynq's enqueue at four payloads")
}

// `jobkey verify` reports no finding for the index entry of a finished job
// whose key has expired and which no trim has removed yet (Work trims once a
// minute; a queue without Work never), whatever Retention the queue's
// processes use: the meta key stores only the shard count, and verify opens
// the queue with the default Retention (24h). On a queue whose jobs are
// retained 1s, judging by 24h would report such an entry as a "stray-entry
// ... there is no job value" and exit non-zero on a queue with nothing
// wrong. (stats likewise counts such expired jobs as succeeded for 24h.)
func TestVerifyIgnoresExpiredJobsWhateverTheRetention(t *testing.T) {
	f := newFixtureWith(t, jobkey.Config{Retention: time.Second})
	ctx, rdb, q := f.ctx, f.rdb, f.q
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rdb.Exists(ctx, q.Keys(j.ID).Job).Val() == 0 },
		5*time.Second, 50*time.Millisecond, "the finished job expires with its retention")
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "the library, with the queue's retention, finds nothing")

	out, err := f.run("verify")
	require.NoError(t, err, "verify of a healthy queue must exit 0:\n%s", out)
}

// No command prints the password of a Redis URL: not when the URL does
// not parse, nor when Redis cannot be reached, nor when -redis is given
// twice.
func TestPasswordIsNeverPrinted(t *testing.T) {
	dead := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		return l.Addr().String()
	}()
	unparsable := []string{
		"redis://admin:" + secret + "@host:port/",     // bad port
		"redis://admin:" + secret + "@" + dead + "/x", // bad database
		"redsi://admin:" + secret + "@" + dead,        // bad scheme
		"redis://admin:S3%zcret@" + dead,              // bad escape, echoed in part
	}
	for cmd, args := range commandArgs {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			try := func(what string, all ...string) {
				t.Helper()
				var out, errOut bytes.Buffer
				err := run(context.Background(), append(append([]string{cmd}, all...), args...), &out, &errOut)
				require.Error(t, err, what)
				requireNoSecret(t, what, err, out.String(), errOut.String())
				require.NotContains(t, err.Error()+errOut.String(), "%zc", what)
			}
			for _, u := range unparsable {
				try(u, "-redis", u)
				try("-redis="+u, "-redis="+u)
				try(u+" twice", "-redis", u, "-redis", u)
			}
			// Parsed, and nobody listens: the address is named, not the password.
			var out, errOut bytes.Buffer
			u := "redis://admin:" + secret + "@" + dead + "/0"
			err := run(context.Background(), append([]string{cmd, "-redis", u}, args...), &out, &errOut)
			require.ErrorIs(t, err, jobkey.ErrUnreachable, cmd)
			require.ErrorContains(t, err, "Redis at "+dead+" could not be reached")
			requireNoSecret(t, "unreachable", err, out.String(), errOut.String())
		})
	}
}

// Nor when the URL comes from REDIS_URL.
func TestPasswordInREDIS_URLIsNeverPrinted(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://admin:"+secret+"@host:port/")
	for cmd, args := range commandArgs {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{cmd}, args...), &out, &errOut)
		require.Error(t, err, cmd)
		requireNoSecret(t, cmd+" with REDIS_URL", err, out.String(), errOut.String())
	}
}

// The bench report's header names the server and the command line with
// the password masked, in report.md, results.json and on stdout.
func TestBenchReportHidesThePassword(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	root := redistest.ClientFor(t, srv.URL(), nil)
	require.NoError(t, root.Do(context.Background(), "acl", "setuser", "bencher", "on", ">"+secret, "~*", "&*", "+@all").Err())
	url := "redis://bencher:" + secret + "@" + srv.Addr + "/0"
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "-redis", url, "-scenarios", "lifecycle", "-payloads", "64",
		"-duration", "100ms", "-out", dir}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	requireNoSecret(t, "bench report", nil, out.String(), errOut.String(), string(md), string(js))
	require.Contains(t, string(md), "-redis redis://bencher:xxxxx@"+srv.Addr+"/0", "the command line is kept, masked")
	require.Contains(t, string(md), "at "+srv.Addr)
}

// stats counts the handlers Work reports stuck: still running after their
// context ended.
func TestStatsShowsStuckHandlers(t *testing.T) {
	f := newFixtureWith(t, jobkey.Config{Lease: time.Second})
	ctx, q := f.ctx, f.q
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	started, release := make(chan struct{}), make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
			close(started)
			<-release // ignores its context
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 1, StuckAfter: 100 * time.Millisecond})
	}()
	t.Cleanup(func() {
		close(release)
		stop()
		<-done
	})
	<-started
	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		out, err := f.run("stats")
		require.NoError(t, err)
		require.Contains(t, out, "| active | stuck handlers |")
		return strings.Contains(out, "| mail | 0 | 0 | 0 | 0 | 1 |")
	}, 10*time.Second, 50*time.Millisecond, "stats shows the stuck handler")
}

// The command compiles only what it runs: `go run ./cmd/jobkey bench` on a
// fresh machine compiles every package the command imports, so the
// charts are drawn without a plotting library and /metrics is written
// without the OpenTelemetry SDK or the Prometheus client (those stay in
// jobkeyotel, for a program's own workers).
func TestCommandCompilesNoPlottingOrTelemetryPackages(t *testing.T) {
	t.Parallel()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the packages with")
	}
	out, err := exec.Command(gocmd, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/jobkey/jobkey/internal/svgchart")
	for _, dep := range deps {
		for _, heavy := range []string{"gonum.org/", "go.opentelemetry.io/", "github.com/prometheus/", "golang.org/x/image/", "codeberg.org/go-"} {
			require.False(t, strings.HasPrefix(dep, heavy), "the command imports %s", dep)
		}
	}
}
