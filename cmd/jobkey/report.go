package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/redact"
	"github.com/redis/go-redis/v9"
)

type report struct {
	Machine  string `json:"machine"`
	Server   string `json:"server"`
	Command  string `json:"command"`
	Embedded bool   `json:"embedded"`
	// RedisCPU is false when the server does not report its CPU time
	// (INFO cpu): miniredis, or a user that may not run INFO. Then every
	// result's Redis CPU is 0 and the report says n/a.
	RedisCPU bool           `json:"redis_cpu"`
	Started  string         `json:"started"`
	Results  []bench.Result `json:"results"`
	// Work holds the worker runs of -workers.
	Work []bench.WorkResult `json:"work,omitempty"`
	// RateNotKept names the designs whose bounded-rate run did not keep
	// its rate (their Pacing.Kept is false): those runs offered less load
	// than asked, and their latencies measure a backlog.
	RateNotKept []string `json:"rate_not_kept,omitempty"`
	// WorkersBehind names the designs whose bounded-rate run kept its rate
	// but processed under workersBehindShare of it: their workers fell
	// behind, and their latencies include the workers' backlog.
	WorkersBehind []string `json:"workers_behind,omitempty"`
}

// workersBehindShare is the share of a bounded-rate run's rate below which
// its processed jobs/s say that the workers fell behind the producers
// (short of the rate by more than a short run's tail latency explains).
const workersBehindShare = 0.9

// workersBehind lists the designs whose bounded-rate run kept its rate but
// whose workers did not keep up with it.
func workersBehind(work []bench.WorkResult) []string {
	var out []string
	for _, r := range work {
		if r.Scenario == bench.BoundedRate && rateKept(r) && r.Throughput() < workersBehindShare*r.Pacing.Rate {
			out = append(out, r.Design)
		}
	}
	return out
}

// rateKept tells whether a bounded-rate run's producers kept their
// schedule, so that its latencies are the bounded rate's.
func rateKept(r bench.WorkResult) bool { return r.Pacing != nil && r.Pacing.Kept }

// rateNotKept lists the designs whose bounded-rate run did not keep its
// rate.
func rateNotKept(work []bench.WorkResult) []string {
	var out []string
	for _, r := range work {
		if r.Scenario == bench.BoundedRate && !rateKept(r) {
			out = append(out, r.Design)
		}
	}
	return out
}

func serverName(ctx context.Context, url string, embedded bool) string {
	if embedded {
		return "embedded miniredis (not Redis: timings are not Redis timings)"
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return redact.URL(url)
	}
	c := redis.NewClient(o)
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return o.Addr
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return fmt.Sprintf("Redis %s at %s", v, o.Addr)
		}
	}
	return o.Addr
}

// redisReportsCPU tells whether the server at url answers INFO cpu with
// its CPU time, which the runs read for Redis's CPU per job.
func redisReportsCPU(ctx context.Context, url string) bool {
	c, err := bench.Client(url, &bench.Probe{}, 1)
	if err != nil {
		return false
	}
	defer c.Close()
	info, err := c.Info(ctx, "cpu").Result()
	return err == nil && strings.Contains(info, "used_cpu_sys:")
}

// cpuCells formats a run's client and Redis CPU and allocations per job;
// Redis's is n/a when the server does not report it.
func (rep report) cpuCells(c bench.CPU, jobs int64) (client, redis, allocs string) {
	cl, rd, al, _ := c.PerJob(jobs)
	redis = "n/a"
	if rep.RedisCPU {
		redis = fmt.Sprintf("%.1f", rd)
	}
	return fmt.Sprintf("%.1f", cl), redis, fmt.Sprintf("%.0f", al)
}

// pair is one measured point of every design: jobkey, the multi-key
// design, and asynq where the scenario has it.
type pair struct{ jk, mk, aq *bench.Result }

func (rep report) pairs(scenario string) (keys []string, by map[string]*pair) {
	by = map[string]*pair{}
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Scenario != scenario {
			continue
		}
		k := fmt.Sprintf("%s|%d", sizeName(r.Payload), r.Clients)
		if by[k] == nil {
			by[k] = &pair{}
			keys = append(keys, k)
		}
		switch r.Design {
		case "jobkey":
			by[k].jk = r
		case "multikey":
			by[k].mk = r
		default:
			by[k].aq = r
		}
	}
	return keys, by
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

func (rep report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# jobkey bench\n\n")
	if rep.Embedded {
		b.WriteString("> **Embedded miniredis, not Redis.** These timings say nothing about either design on Redis; pass `-redis URL` for figures to compare.\n\n")
	}
	fmt.Fprintf(&b, "- machine: %s\n- server: %s\n- command: `%s`\n- started: %s\n\n", rep.Machine, rep.Server, rep.Command, rep.Started)
	b.WriteString("Every op is one job. p50/p99 are per call (a batched call handles a whole batch). " +
		"jobkey × = jobkey's jobs/s ÷ this design's jobs/s in the same run (above 1: jobkey is faster). cmds and rtt are Redis commands and round trips per job, " +
		"wire is bytes sent plus received per job, conflicts are aborted EXECs per job. " +
		"Client and Redis µs/job are the CPU time per job over the timed phase (getrusage of this process, INFO cpu of the server), " +
		"allocs/job the client's heap allocations per job; " + cpuChartFile + " draws the CPU per job by design.\n\n")
	if !rep.RedisCPU {
		b.WriteString("Redis µs/job is n/a: the server does not report its CPU time (INFO cpu).\n\n")
	}
	if rep.Embedded {
		b.WriteString("The embedded server runs in this process: client µs/job includes its CPU.\n\n")
	}
	for _, sc := range bench.Scenarios {
		keys, by := rep.pairs(sc)
		if len(keys) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n", sc)
		b.WriteString("| payload | clients | design | jobs/s | jobkey × | p50 | p99 | cmds/job | rtt/job | wire B/job | client µs/job | Redis µs/job | allocs/job | conflicts/job | errors |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, k := range keys {
			p := by[k]
			for _, r := range []*bench.Result{p.jk, p.mk, p.aq} {
				if r == nil {
					continue
				}
				ratio := ""
				if r != p.jk && p.jk != nil && r.Throughput() > 0 {
					ratio = fmt.Sprintf("%.2f×", p.jk.Throughput()/r.Throughput())
				}
				client, redis, allocs := rep.cpuCells(r.CPU, r.Jobs)
				fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %s | %s | %s | %.2f | %.2f | %.0f | %s | %s | %s | %.3f | %d |\n",
					sizeName(r.Payload), r.Clients, r.Design, r.Throughput(), ratio, dur(r.P50), dur(r.P99),
					r.Per(r.Wire.Cmds), r.Per(r.Wire.RTT), r.Per(r.Wire.BytesOut+r.Wire.BytesIn), client, redis, allocs, r.Per(r.Conflicts), r.Errors)
			}
		}
		b.WriteString("\n")
	}
	rep.workTable(&b)
	rep.clusterTable(&b)
	return b.String()
}

// workTable shows the worker runs: each design's own worker draining a
// backlog (burn-down), keeping up with producers (produce-and-work) and
// with producers at a fixed rate (bounded-rate).
func (rep report) workTable(b *strings.Builder) {
	for _, sc := range workerScenarios {
		var rows []bench.WorkResult
		var jk *bench.WorkResult
		for i, r := range rep.Work {
			if r.Scenario == sc {
				rows = append(rows, r)
				if r.Design == "jobkey" {
					jk = &rep.Work[i]
				}
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(b, "## workers: %s\n\n", sc)
		if sc == bench.BoundedRate {
			boundedRateTable(b, rep, rows)
			continue
		}
		b.WriteString("Each design's own worker, 8 slots, a handler that does nothing, 1 KiB payloads")
		if sc == bench.ProduceAndWork {
			b.WriteString(", 8 producers enqueueing meanwhile; p50/p99 are enqueue-to-start latency")
		}
		b.WriteString(".\n\n| design | jobs | jobs/s | jobkey × | rtt/job | cmds/job | client µs/job | Redis µs/job | allocs/job | p50 | p99 |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rows {
			ratio, p50, p99 := "", "", ""
			if jk != nil && r.Design != "jobkey" && r.Throughput() > 0 {
				ratio = fmt.Sprintf("%.2f×", jk.Throughput()/r.Throughput())
			}
			if sc == bench.ProduceAndWork {
				p50, p99 = dur(r.P50), dur(r.P99)
			}
			client, redis, allocs := rep.cpuCells(r.CPU, r.Jobs)
			fmt.Fprintf(b, "| %s | %d | %.0f | %s | %.2f | %.2f | %s | %s | %s | %s | %s |\n", r.Design, r.Jobs, r.Throughput(), ratio,
				r.Per(r.Wire.RTT), r.Per(r.Wire.Cmds), client, redis, allocs, p50, p99)
		}
		b.WriteString("\n")
	}
}

// boundedRateTable shows the bounded-rate runs: their enqueue-to-start
// latencies and how closely the producers kept the rate. A run that did
// not keep it is flagged, and its latencies are marked as a backlog's
// rather than printed as the rate's.
func boundedRateTable(b *strings.Builder, rep report, rows []bench.WorkResult) {
	b.WriteString("Each design's own worker, 8 slots, a handler that does nothing, 1 KiB payloads, " +
		"8 producers enqueueing at a fixed total rate on an open-loop schedule. " +
		"p50, p99 and p99.9 are enqueue-to-start latency counted from each job's intended send time; " +
		"sent is the rate the producers achieved, lag p99 and lag max how late their enqueue calls began, " +
		"end lag how far behind the schedule they ended. The median of repetitions is by p99, not jobs/s, which the rate pins.\n\n")
	if nk := rateNotKept(rows); len(nk) > 0 {
		fmt.Fprintf(b, "> **Rate not kept** by %s: the producers ended behind their schedule, so the run offered less load than asked "+
			"and its latencies, marked \"backlog\", measure a backlog, not the bounded rate. Lower `-worker-rate`.\n\n", strings.Join(nk, ", "))
	}
	if wb := workersBehind(rows); len(wb) > 0 {
		fmt.Fprintf(b, "> **Workers behind** for %s: they processed under %.0f%% of the rate, so the jobs queued up "+
			"and the latencies include that backlog, not only the pickup. Lower `-worker-rate` below their burn-down rate.\n\n",
			strings.Join(wb, ", "), 100*workersBehindShare)
	}
	b.WriteString("| design | jobs | rate jobs/s | sent jobs/s | jobs/s | rtt/job | cmds/job | client µs/job | Redis µs/job | allocs/job | p50 | p99 | p99.9 | lag p99 | lag max | end lag | rate kept |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		pc := bench.Pacing{}
		if r.Pacing != nil {
			pc = *r.Pacing
		}
		lat, kept := dur, "yes"
		if !rateKept(r) {
			lat = func(d time.Duration) string { return "backlog " + dur(d) }
			kept = "**NO**"
		}
		client, redis, allocs := rep.cpuCells(r.CPU, r.Jobs)
		fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Design, r.Jobs, pc.Rate, pc.Sent, r.Throughput(), r.Per(r.Wire.RTT), r.Per(r.Wire.Cmds), client, redis, allocs,
			lat(r.P50), lat(r.P99), lat(r.P999), dur(pc.LagP99), dur(pc.LagMax), dur(pc.EndLag), kept)
	}
	b.WriteString("\n")
}

// clusterTable shows each master's share of a cluster run's keys and
// commands, per design and scenario.
func (rep report) clusterTable(b *strings.Builder) {
	header := false
	for _, r := range rep.Results {
		if len(r.Nodes) == 0 {
			continue
		}
		if !header {
			b.WriteString("## cluster: each master's share\n\n")
			b.WriteString("| scenario | payload | design | master | keys | share of keys | commands/s | share of commands |\n|---|---|---|---|---|---|---|---|\n")
			header = true
		}
		var keys, cmds int64
		for _, n := range r.Nodes {
			keys, cmds = keys+n.Keys, cmds+n.Commands
		}
		for _, n := range r.Nodes {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %d | %.1f%% | %.0f | %.1f%% |\n", r.Scenario, sizeName(r.Payload), r.Design, n.Addr,
				n.Keys, pct(n.Keys, keys), float64(n.Commands)/r.Elapsed.Seconds(), pct(n.Commands, cmds))
		}
	}
	if header {
		b.WriteString("\n")
	}
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
