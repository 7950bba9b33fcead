package jobkey

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/heartbeat"
	"github.com/jobkey/jobkey/internal/reply"
)

// A running Work reports itself in one small value with a TTL: its
// process, its slots, the jobs it runs and the schedules it keeps. It
// renews the value every Lease/3, and within a second of a run starting or
// ending, and takes it off the list when it returns; a process that dies
// stops renewing it, and it lapses one Lease later, when Redis expires it. So the list of workers needs no sweeper and
// holds nothing a dead process left: the value's TTL is the truth, and
// the queue's workers set, scored by when each report lapses, is the hint
// that finds the values without a SCAN.

// WorkerInfo is what a running Work reports of itself (Queue.Workers).
type WorkerInfo struct {
	Name      string         `json:"name"` // WorkOpts.Name: the prefix of its runners' lease owners ("<Name>/<i>")
	Host      string         `json:"host"`
	PID       int            `json:"pid"`
	Queues    []string       `json:"queues"` // the queues its process works with this Work (WorkQueues: all of them)
	Slots     int            `json:"slots"`  // WorkOpts.Concurrency
	Busy      int            `json:"busy"`   // slots running a handler
	Running   []RunInfo      `json:"running,omitempty"`
	Schedules []ScheduleInfo `json:"schedules,omitempty"`
	StartedAt time.Time      `json:"started_at"`
	// Version is the jobkey module's version the process was built with
	// ("(devel)" for a build of jobkey itself or from a workspace holding
	// it; "unknown" when the binary carries no build information).
	Version string `json:"version"`
	// SeenAt is when the report was written, by Redis's clock; LapsesAt,
	// when it lapses unless renewed.
	SeenAt   time.Time `json:"seen_at"`
	LapsesAt time.Time `json:"lapses_at"`
	// Err, when set, says the report could not be read; its other fields
	// are empty but Name. The value is left as it is and lapses by itself.
	Err error `json:"-"`
}

// RunInfo is one job a worker runs.
type RunInfo struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Attempt   int       `json:"attempt"`
	Runner    string    `json:"runner"` // the lease owner
	StartedAt time.Time `json:"started_at"`
}

// ScheduleInfo is one periodic schedule a worker keeps (WorkOpts.Periodic).
type ScheduleInfo struct {
	Name string `json:"name"`
	// Spec is the schedule as it prints itself (fmt's %v: "every 1m0s",
	// or a cron schedule's own String when it has one, else its Go type).
	Spec string `json:"spec"`
	Type string `json:"type"`
	// NextTick is the schedule's next tick after SeenAt; LastTick its
	// latest tick at or before SeenAt, and LastJobID the ID its job has
	// (or would have: a tick missed while the queue was paused, or from
	// before the schedule was first seen, has none). Zero when none.
	NextTick  time.Time `json:"next_tick"`
	LastTick  time.Time `json:"last_tick"`
	LastJobID string    `json:"last_job_id,omitempty"`
}

// workerReportVersion is the version of the report's JSON; a reader
// refuses a report of a later one as unreadable, not as empty.
const workerReportVersion = 1

type workerReport struct {
	V int `json:"v"`
	WorkerInfo
}

// jobkeyVersion is the version of the jobkey module in this build.
var jobkeyVersion = func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if bi.Main.Path == "github.com/jobkey/jobkey" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/jobkey/jobkey" {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	// Built from a go.work workspace that holds jobkey: no version.
	return "(devel)"
}()

// maxReportedRuns bounds the runs a report lists: the report stays small
// whatever the Concurrency; Busy still counts them all.
const maxReportedRuns = 100

// info is this Work's report as of now (Redis's clock).
func (w *worker) info(now time.Time) WorkerInfo {
	host, _ := os.Hostname()
	wi := WorkerInfo{Name: w.o.Name, Host: host, PID: os.Getpid(), Queues: w.queues, Slots: w.o.Concurrency,
		StartedAt: w.started, Version: jobkeyVersion, SeenAt: now, LapsesAt: now.Add(w.q.cfg.Lease)}
	w.mu.Lock()
	for r := range w.running {
		wi.Busy++
		if len(wi.Running) < maxReportedRuns {
			j := r.job
			wi.Running = append(wi.Running, RunInfo{ID: j.ID, Type: j.Type, Attempt: j.Attempt, Runner: j.LeaseOwner, StartedAt: j.StartedAt})
		}
	}
	w.mu.Unlock()
	slices.SortFunc(wi.Running, func(a, b RunInfo) int { return strings.Compare(a.Runner, b.Runner) })
	for _, p := range w.o.Periodic {
		si := ScheduleInfo{Name: p.Name, Spec: scheduleSpec(p.Schedule), Type: p.Type}
		if tick, next, _, err := look(p.Schedule, now); err == nil {
			si.NextTick, si.LastTick = next, tick
			if !tick.IsZero() {
				ck := ""
				if p.Opts != nil {
					ck = p.Opts.ConcurrencyKey
				}
				if id, err := w.q.IDFor(ck, periodicID(p.Name, tick)); err == nil {
					si.LastJobID = id
				}
			}
		}
		wi.Schedules = append(wi.Schedules, si)
	}
	return wi
}

// scheduleSpec is how a schedule prints itself.
func scheduleSpec(s Schedule) (spec string) {
	defer func() {
		if recover() != nil {
			spec = fmt.Sprintf("%T", s)
		}
	}()
	if e, ok := s.(every); ok {
		return "every " + time.Duration(e).String()
	}
	if st, ok := s.(fmt.Stringer); ok {
		return st.String()
	}
	return fmt.Sprintf("%T", s)
}

// reportGap is the least time between two reports of a Work whose runs
// keep changing: a busy Work writes one small value a second, no more.
const reportGap = time.Second

// runsChanged tells the reporter that a run started or stopped.
func (w *worker) runsChanged() {
	select {
	case w.runsMoved <- struct{}{}:
	default:
	}
}

// reporter keeps this Work's report until ctx ends, then deletes it. It
// writes the report every Lease/3, and within reportGap of a run starting
// or stopping.
func (w *worker) reporter(ctx context.Context) {
	every := w.q.cfg.Lease / 3
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ended := false; !ended; {
		select {
		case <-ctx.Done():
			ended = true
			continue
		case <-timer.C:
		case <-w.runsMoved:
			timer.Stop()
		}
		if err := w.report(ctx); err != nil && ctx.Err() == nil {
			w.o.Logger.Debug("jobkey: could not write this worker's report; retrying", "queue", w.q.name, "worker", w.o.Name, "err", err)
		}
		// Changes wait out the gap, then go in the next report.
		if sleepCtx(ctx, min(reportGap, every)) != nil {
			break
		}
		timer.Reset(every - min(reportGap, every))
	}
	// Off the list at once rather than a Lease later; the value lapses by
	// its TTL (the worker's ACL line has no DEL). A Work that cannot say
	// so leaves both to lapse.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = heartbeat.Leave(dctx, w.q.rdb, w.q.ks.workersKey(), w.o.Name)
}

// report writes this Work's report, with its TTL, and its entry in the
// workers set, dropping the entries of reports that lapsed.
func (w *worker) report(ctx context.Context) error {
	now, err := w.q.clock.Now(ctx, w.q.rdb)
	if err != nil {
		return err
	}
	if w.started.IsZero() {
		w.started = now // Redis's clock was not known when Work started
	}
	b, err := json.Marshal(workerReport{V: workerReportVersion, WorkerInfo: w.info(now)})
	if err != nil {
		return err
	}
	return heartbeat.Write(ctx, w.q.rdb, heartbeat.Beat{Key: w.q.ks.workerKey(w.o.Name), Value: b, TTL: w.q.cfg.Lease,
		Set: w.q.ks.workersKey(), Member: w.o.Name, Now: now})
}

// Workers lists the Works of this queue that are running now, in every
// process, by name: each reports itself every Lease/3, and a process that
// died drops off the list within one Lease, by its report's TTL. A report
// that cannot be read is listed with Err set, never deleted. One round
// trip for the list and one for the reports.
func (q *Queue) Workers(ctx context.Context) ([]WorkerInfo, error) {
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return nil, err
	}
	names, err := heartbeat.Live(ctx, q.rdb, q.ks.workersKey(), now)
	if err != nil {
		if reply.IsWrongType(err) {
			return nil, &WrongTypeError{Key: q.ks.workersKey(), Want: "zset", Got: "non-zset"}
		}
		return nil, fmt.Errorf("jobkey: workers of %q: %w", q.name, err)
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = q.ks.workerKey(n)
	}
	vals, err := q.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("jobkey: workers of %q: %w", q.name, err)
	}
	out := make([]WorkerInfo, 0, len(names))
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue // lapsed since the list was read (MGET answers nil for a missing key or one of another type)
		}
		var r workerReport
		switch err := json.Unmarshal([]byte(s), &r); {
		case err != nil:
			out = append(out, WorkerInfo{Name: names[i], Err: fmt.Errorf("%w: worker report %s: %v", ErrCorrupt, keys[i], err)})
		case r.V > workerReportVersion:
			out = append(out, WorkerInfo{Name: names[i], Err: fmt.Errorf("%w: worker report %s is version %d, this jobkey reads up to %d",
				ErrUnsupportedFormat, keys[i], r.V, workerReportVersion)})
		default:
			r.WorkerInfo.Name = names[i]
			out = append(out, r.WorkerInfo)
		}
	}
	return out, nil
}

// WorkerOf returns the name of the Work whose runner owns a lease
// (Job.LeaseOwner, "<WorkOpts.Name>/<i>"), as Queue.Workers lists it.
func WorkerOf(leaseOwner string) string {
	if i := strings.LastIndexByte(leaseOwner, '/'); i > 0 {
		if _, err := strconv.Atoi(leaseOwner[i+1:]); err == nil {
			return leaseOwner[:i]
		}
	}
	return leaseOwner
}
