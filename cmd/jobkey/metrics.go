package main

import (
	"bufio"
	"cmp"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/jobkey/jobkey"
)

// queueMetrics serves the metrics of its queues in Prometheus's text
// format (version 0.0.4): the gauges of Queue.Stats and the counters of
// Queue.Metrics, under the names, labels and help texts that
// jobkeyotel.NewPrometheus gives them, without its otel_scope_* labels and
// target_info. It writes them itself so that the command compiles neither
// the OpenTelemetry SDK nor the Prometheus client; a program's own workers
// are measured with jobkeyotel. Each scrape reads every queue's Stats; a
// queue whose Stats fails, wholly or for some shards, has no gauges of
// Stats in that scrape, and the error is logged.
type queueMetrics struct {
	queues []*jobkey.Queue // sorted by name
	log    *slog.Logger
}

// newQueueMetrics serves the metrics of queues, logging to log.
func newQueueMetrics(log *slog.Logger, queues ...*jobkey.Queue) *queueMetrics {
	queues = slices.Clone(queues)
	slices.SortFunc(queues, func(a, b *jobkey.Queue) int { return cmp.Compare(a.Name(), b.Name()) })
	return &queueMetrics{queues: queues, log: log}
}

// metricFamily is one metric of the exposition: its name, type and help,
// and how to read its samples from a queue's counters and Stats (nil
// when Stats could not be read).
type metricFamily struct {
	name, kind, help string
	fromMetrics      func(jobkey.MetricsSnapshot) int64
	fromStats        func(jobkey.Stats) []stateCount
	// statesOfMetrics is a gauge of Queue.Metrics by state.
	statesOfMetrics func(jobkey.MetricsSnapshot) []stateCount
}

// stateCount is one sample of jobkey_queue_jobs.
type stateCount struct {
	state string
	n     int64
}

// casHelp ends the help of the counters of Queue.Metrics, as in jobkeyotel.
const casHelp = " By queue, in this process."

// families are the metrics served, sorted by name as a Prometheus registry
// sorts them.
var families = []metricFamily{
	{name: "jobkey_cas_attempts_total", kind: "counter", help: "Compare-and-set attempts, retries after conflicts included." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Attempts }},
	{name: "jobkey_cas_commands_total", kind: "counter", help: "Redis commands sent by the compare-and-set engine, MULTI and EXEC included." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Commands }},
	{name: "jobkey_cas_conflicts_total", kind: "counter", help: "EXECs aborted because a watched key changed." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Conflicts }},
	{name: "jobkey_cas_rides_total", kind: "counter", help: "Reads sent behind the EXEC of the batch before them, on its connection: a round trip saved each." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Rides }},
	{name: "jobkey_cas_round_trips_total", kind: "counter", help: "Network round trips of the compare-and-set engine." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.RoundTrips }},
	{name: "jobkey_cas_transactions_total", kind: "counter", help: "Compare-and-set transactions run." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Txns }},
	{name: "jobkey_cas_unwatches_total", kind: "counter", help: "UNWATCHes sent on paths that did not reach EXEC." + casHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Unwatches }},
	{name: "jobkey_queue_jobs", kind: "gauge", help: "Jobs in each state, from Queue.Stats, by queue and state.",
		fromStats: statesOf},
	{name: "jobkey_queue_paused_shards", kind: "gauge", help: "Shards of the queue paused by Queue.Pause, by queue.",
		fromStats: func(st jobkey.Stats) []stateCount { return []stateCount{{n: int64(st.PausedShards)}} }},
	{name: "jobkey_queue_stuck_handlers", kind: "gauge", help: "Handlers still running after their contexts ended, in every process, from Queue.Stats, by queue.",
		fromStats: func(st jobkey.Stats) []stateCount { return []stateCount{{n: st.StuckHandlers}} }},
	{name: "jobkey_work_attempts_failed_total", kind: "counter", help: "Attempts that failed (an error, a panic, a timeout, a deadline), in this process's Works." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.AttemptsFailed }},
	{name: "jobkey_work_jobs_canceled_total", kind: "counter", help: "Runs stopped because their job was canceled while it ran." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Canceled }},
	{name: "jobkey_work_jobs_failed_total", kind: "counter", help: "Jobs failed for good: no attempt left, or ErrSkipRetry." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.FailedForGood }},
	{name: "jobkey_work_jobs_succeeded_total", kind: "counter", help: "Jobs completed by this process's Works." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Succeeded }},
	{name: "jobkey_work_retries_scheduled_total", kind: "counter", help: "Failed attempts whose job was put back to run again under backoff." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.RetriesScheduled }},
	{name: "jobkey_work_runners", kind: "gauge", help: "Runners of this process's Works, busy (running a handler) or idle, by queue and state.",
		statesOfMetrics: func(m jobkey.MetricsSnapshot) []stateCount {
			return []stateCount{{"busy", m.BusyRunners}, {"idle", max(m.Runners-m.BusyRunners, 0)}}
		}},
	{name: "jobkey_work_runs_released_total", kind: "counter", help: "Runs given back with their attempt unspent (shutdown, a claim that came too late)." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Released }},
	{name: "jobkey_work_runs_snoozed_total", kind: "counter", help: "Runs that snoozed: their job runs again later, their attempt unspent." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Snoozed }},
	{name: "jobkey_work_jobs_prefetched_total", kind: "counter", help: "Jobs claimed ahead of free slots by this process's Works (WorkOpts.Prefetch)." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.Prefetched }},
	{name: "jobkey_work_prefetch_returned_total", kind: "counter", help: "Jobs claimed ahead and given back unrun: no slot took them in time, or Work stopped." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.PrefetchReturned }},
	{name: "jobkey_work_stuck_detections_total", kind: "counter", help: "Handlers reported stuck, in this process, by queue.",
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.StuckDetected }},
	{name: "jobkey_work_stuck_handlers", kind: "gauge", help: "Handlers still running after their contexts ended, in this process, by queue.",
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.StuckHandlers }},
	{name: "jobkey_writes_batch_callbacks_total", kind: "counter", help: "Batch callbacks and chain steps written by this process's transactions, enqueued or canceled by their condition." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.BatchCallbacks }},
	{name: "jobkey_writes_events_total", kind: "counter", help: "Events appended to the queue's streams by this process's transactions." + workHelp,
		fromMetrics: func(m jobkey.MetricsSnapshot) int64 { return m.EventsAppended }},
}

// workHelp ends the help of the counters of what Work recorded, as in
// jobkeyotel.
const workHelp = " By queue."

// statesOf lists the counts of Stats by state, sorted by state.
func statesOf(st jobkey.Stats) []stateCount {
	return []stateCount{
		{"active", st.Active}, {"canceled", st.Canceled}, {"corrupt", st.Corrupt}, {"due", st.Due},
		{"expired_leases", st.ExpiredLeases}, {"failed", st.Failed}, {"newer", st.Newer},
		{"pending", st.Pending}, {"scheduled", st.Scheduled}, {"succeeded", st.Succeeded},
		{"vanished", st.Vanished},
	}
}

func (m *queueMetrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	type reading struct {
		queue   string
		metrics jobkey.MetricsSnapshot
		stats   *jobkey.Stats // nil: Stats failed
	}
	readings := make([]reading, len(m.queues))
	for i, q := range m.queues {
		readings[i] = reading{queue: q.Name(), metrics: q.Metrics()}
		st, err := q.Stats(r.Context())
		if err != nil {
			m.log.Warn("jobkey ui: /metrics: no depth for this queue in this scrape", "queue", q.Name(), "err", err)
			continue
		}
		readings[i].stats = &st
	}

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	out := bufio.NewWriter(w)
	for _, f := range families {
		var lines []string
		for _, rd := range readings {
			labels := `jobkey_queue="` + escapeLabel(rd.queue) + `"`
			switch {
			case f.fromMetrics != nil:
				lines = append(lines, f.name+"{"+labels+"} "+strconv.FormatInt(f.fromMetrics(rd.metrics), 10))
			case f.statesOfMetrics != nil:
				for _, s := range f.statesOfMetrics(rd.metrics) {
					lines = append(lines, f.name+"{"+labels+`,jobkey_state="`+s.state+`"} `+strconv.FormatInt(s.n, 10))
				}
			case rd.stats != nil:
				for _, s := range f.fromStats(*rd.stats) {
					l := labels
					if s.state != "" {
						l += `,jobkey_state="` + s.state + `"`
					}
					lines = append(lines, f.name+"{"+l+"} "+strconv.FormatInt(s.n, 10))
				}
			}
		}
		if len(lines) == 0 {
			continue // a registry leaves out a metric without samples
		}
		out.WriteString("# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.kind + "\n")
		for _, l := range lines {
			out.WriteString(l + "\n")
		}
	}
	if err := out.Flush(); err != nil {
		m.log.Warn("jobkey ui: /metrics: writing the reply", "err", err)
	}
}

// escapeLabel escapes a label value as the text format requires:
// backslash, double quote and line feed.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
