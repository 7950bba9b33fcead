package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/asynqcompat"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// The exit codes of migrate-asynq and migrate-to-asynq, one per outcome
// (cmd/jobkey/README.md lists them). Any other error exits 1.
const (
	exitMigrated = 0 // every task of the types that waits moved (active ones are left to finish)
	exitStopped  = 1 // the run stopped on an error (Redis, a signal): rerun the same command to go on
	exitRefused  = 2 // bad flags, or a -type that matches nothing: nothing was written
	exitLeft     = 3 // tasks stay in the source by design: skipped, each listed with why
	exitLocked   = 4 // another migration of the asynq queue holds its lock (see -wait)
	exitNoQueue  = 5 // the source queue does not exist: nothing was written
	exitTwice    = 6 // tasks were found run by both systems: look at them
	exitBusy     = 7 // a migration through another asynq queue holds the jobkey queue (running, or stopped with moves unfinished)
)

// exitError is an error with the exit code the command ends with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the code the command exits with after err.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := errors.AsType[*exitError](err); ok {
		return e.code
	}
	return 1
}

// errMigrateUnfinished makes a migration exit non-zero when tasks stay
// behind that the operator must look at.
var errMigrateUnfinished = errors.New("some tasks did not move: see the lists above")

// errRunTwice makes a migration exit non-zero when it found tasks that both
// systems ran.
var errRunTwice = errors.New("some tasks were run by both systems: see the list above")

// migrateFlags are the flags both directions share.
type migrateFlags struct {
	redisURL, prefix, typ, asynqQueue, queue string
	types                                    []string
	dryRun, json, pause                      bool
	concurrency                              int
	wait                                     time.Duration
	replicas                                 replicaFlags // the jobkey queue's writes wait for these
}

func (m *migrateFlags) parse(name string, args []string, stderr io.Writer, asynqFlag, jobkeyFlag, pauseHelp string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&m.redisURL, "redis", "", "Redis URL of asynq and of jobkey, required (default: $REDIS_URL)")
	fs.StringVar(&m.asynqQueue, asynqFlag, "default", "the asynq queue")
	fs.StringVar(&m.typ, "type", "", "the task types to move, comma-separated (required)")
	fs.StringVar(&m.queue, jobkeyFlag, "", "the jobkey queue (required)")
	fs.StringVar(&m.prefix, "prefix", "jobkey", "key prefix of the jobkey queue")
	fs.BoolVar(&m.dryRun, "dry-run", false, "list what would move; write nothing")
	fs.BoolVar(&m.json, "json", false, "print the report as one JSON object on stdout")
	fs.BoolVar(&m.pause, "pause", false, pauseHelp)
	fs.IntVar(&m.concurrency, "concurrency", 8, "tasks moved at once")
	fs.DurationVar(&m.wait, "wait", 0, "wait up to this long for another migration of the asynq queue (or a killed one's lock, which ends within 6s) instead of refusing")
	m.replicas.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if m.redisURL == "" {
		m.redisURL = os.Getenv("REDIS_URL")
	}
	if _, err := m.replicas.resolve(m.redisURL); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for t := range strings.SplitSeq(m.typ, ",") {
		t = strings.TrimSpace(t)
		switch {
		case t == "" && m.typ != "":
			return fmt.Errorf("%s: -type %q names an empty type", name, m.typ)
		case slices.Contains(m.types, t):
			return fmt.Errorf("%s: -type names %q twice", name, t)
		case t != "":
			m.types = append(m.types, t)
		}
	}
	switch {
	case len(m.types) == 0:
		return fmt.Errorf("%s: -type is required", name)
	case m.queue == "":
		return fmt.Errorf("%s: -%s (the jobkey queue) is required", name, jobkeyFlag)
	case m.redisURL == "":
		return fmt.Errorf("%s: -redis (or REDIS_URL) is required: it moves live tasks", name)
	case fs.NArg() > 0:
		return fmt.Errorf("%s: unexpected arguments %q", name, fs.Args())
	}
	return nil
}

// open connects and looks the jobkey queue up: with the shard count it
// stored, or, when it does not exist yet and mayCreate, with the defaults.
// The queue is not opened yet (NewQueue writes its meta key): open returns
// the function that opens it, once the names were checked, and whether it
// exists.
func (m *migrateFlags) open(ctx context.Context, mayCreate bool) (openQ func() (*jobkey.Queue, error), exists bool, rdb redis.UniversalClient, err error) {
	rdb, err = connect(ctx, m.redisURL)
	if err != nil {
		return nil, false, nil, err
	}
	cfg := m.replicas.setting.config(m.prefix, 0)
	shards, err := jobkey.LookupShards(ctx, rdb, m.prefix, m.queue)
	switch {
	case err == nil:
		cfg.Shards, exists = shards, true
	case errors.Is(err, jobkey.ErrNotFound) && mayCreate:
	case errors.Is(err, jobkey.ErrNotFound):
		rdb.Close()
		return nil, false, nil, &exitError{exitNoQueue, fmt.Errorf("jobkey queue %q (prefix %q) does not exist: nothing to move", m.queue, m.prefix)}
	default:
		rdb.Close()
		return nil, false, nil, err
	}
	return func() (*jobkey.Queue, error) { return jobkey.NewQueue(rdb, m.queue, cfg) }, exists, rdb, nil
}

// asynqQueueExists says whether asynq knows the queue (it lists every
// queue a task was ever enqueued to, until the queue is deleted).
func asynqQueueExists(ins *asynq.Inspector, queue string) (bool, error) {
	qs, err := ins.Queues()
	if err != nil {
		return false, fmt.Errorf("list asynq queues: %w", err)
	}
	return slices.Contains(qs, queue), nil
}

// asynqHasType says whether the asynq queue holds a task of typ, in any
// state asynq lists.
func asynqHasType(ctx context.Context, ins *asynq.Inspector, queue, typ string) (bool, error) {
	listers := []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		ins.ListPendingTasks, ins.ListActiveTasks, ins.ListScheduledTasks, ins.ListRetryTasks,
		ins.ListArchivedTasks, ins.ListCompletedTasks,
	}
	const size = 500
	for _, list := range listers {
		for page := 1; ; page++ {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			tasks, err := list(queue, asynq.Page(page), asynq.PageSize(size))
			if err != nil {
				return false, fmt.Errorf("list tasks of asynq queue %q: %w", queue, err)
			}
			if slices.ContainsFunc(tasks, func(ti *asynq.TaskInfo) bool { return ti != nil && ti.Type == typ }) {
				return true, nil
			}
			if len(tasks) < size {
				break
			}
		}
	}
	return false, nil
}

// jobkeyHasType says whether the jobkey queue holds a job of typ, in any
// state.
func jobkeyHasType(ctx context.Context, q *jobkey.Queue, typ string) (bool, error) {
	for _, st := range []jobkey.State{jobkey.StatePending, jobkey.StateActive, jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled} {
		cursor := ""
		for {
			page, err := q.List(ctx, jobkey.ListOpts{State: st, Type: typ, Limit: jobkey.MaxListLimit, Cursor: cursor})
			if err != nil {
				return false, fmt.Errorf("list %s jobs of jobkey queue %q: %w", st, q.Name(), err)
			}
			if slices.ContainsFunc(page.Jobs, func(j *jobkey.Job) bool { return j.Type == typ }) {
				return true, nil
			}
			if page.Next == "" {
				break
			}
			cursor = page.Next
		}
	}
	return false, nil
}

// unknownTypes returns the types of which neither the asynq queue (when it
// exists) nor the jobkey queue (when not nil) holds a task or job: a
// mistyped -type.
func unknownTypes(ctx context.Context, ins *asynq.Inspector, asynqQueue string, asynqExists bool, q *jobkey.Queue, types []string) ([]string, error) {
	var unknown []string
	for _, typ := range types {
		if asynqExists {
			ok, err := asynqHasType(ctx, ins, asynqQueue, typ)
			if err != nil {
				return nil, err
			}
			if ok {
				continue
			}
		}
		ok := false
		if q != nil {
			var err error
			if ok, err = jobkeyHasType(ctx, q, typ); err != nil {
				return nil, err
			}
		}
		if !ok {
			unknown = append(unknown, typ)
		}
	}
	return unknown, nil
}

// isTerminal says whether w is a terminal.
func isTerminal(w io.Writer) bool {
	if r, ok := w.(redactingWriter); ok {
		w = r.w
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// bar shows a run's progress on stderr: one bar per phase and pass, and
// nothing when stderr is not a terminal (a log, a pipe, a script).
func bar(stderr io.Writer) (func(asynqcompat.MigrateProgress), func()) {
	if !isTerminal(stderr) {
		return nil, func() {}
	}
	var b *progressbar.ProgressBar
	var phase string
	var pass int
	finish := func() {
		if b != nil {
			_ = b.Finish()
			fmt.Fprintln(stderr)
		}
	}
	return func(p asynqcompat.MigrateProgress) {
		if b == nil || p.Phase != phase || p.Pass != pass {
			finish()
			phase, pass = p.Phase, p.Pass
			total := int64(p.Total)
			if total == 0 {
				total = -1 // a spinner: the total is not known ahead
			}
			b = progressbar.NewOptions64(total, progressbar.OptionSetWriter(stderr),
				progressbar.OptionSetDescription(fmt.Sprintf("pass %d: %s", p.Pass, p.Phase)),
				progressbar.OptionShowCount(), progressbar.OptionThrottle(100_000_000))
		}
		_ = b.Set(p.Done)
	}, finish
}

// typeRun is what a run did for one type.
type typeRun struct {
	typ string
	rep asynqcompat.MigrateReport
	err error // nil, or what stopped it
}

// printReport prints what a run moved, skipped and left, type by type.
func printReport(stdout io.Writer, runs []typeRun, from, to string) {
	for i, r := range runs {
		rep := r.rep
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if rep.DryRun {
			fmt.Fprintf(stdout, "dry run: %d tasks of type %q would move from %s to %s; nothing was written\n", rep.WouldMove, r.typ, from, to)
		} else {
			fmt.Fprintf(stdout, "moved %d tasks of type %q from %s to %s (and finished %d moves an earlier, stopped run had begun) in %d passes\n",
				rep.Moved, r.typ, from, to, rep.AlreadyMoved, rep.Passes)
		}
		lists := []struct {
			title string
			notes []asynqcompat.TaskNote
		}{
			{"skipped (they stay in the source)", rep.Skipped},
			{"left running in the source", rep.Left},
			{"started or run by the source during the move; the copy was deleted again", rep.Undone},
			{"RUN IN BOTH: started by both systems during the move", rep.Twice},
		}
		for _, l := range lists {
			if len(l.notes) == 0 {
				continue
			}
			fmt.Fprintf(stdout, "\n%s: %d\n\n| task | state | reason |\n|---|---|---|\n", l.title, len(l.notes))
			for _, n := range l.notes {
				fmt.Fprintf(stdout, "| %s | %s | %s |\n", n.ID, n.State, n.Reason)
			}
		}
	}
}

// The -json report: one object on stdout, whatever the outcome once the
// flags were read.
type (
	migrateJSON struct {
		Command     string     `json:"command"`
		AsynqQueue  string     `json:"asynq_queue"`
		JobkeyQueue string     `json:"jobkey_queue"`
		DryRun      bool       `json:"dry_run"`
		Types       []typeJSON `json:"types"`
		ExitCode    int        `json:"exit_code"`
		Error       string     `json:"error,omitempty"`
	}
	typeJSON struct {
		Type         string     `json:"type"`
		Moved        int        `json:"moved"`
		AlreadyMoved int        `json:"already_moved"`
		WouldMove    int        `json:"would_move"`
		Passes       int        `json:"passes"`
		Skipped      []noteJSON `json:"skipped"`
		Left         []noteJSON `json:"left"`
		Undone       []noteJSON `json:"undone"`
		Twice        []noteJSON `json:"twice"`
		Error        string     `json:"error,omitempty"`
	}
	noteJSON struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		Reason string `json:"reason"`
	}
)

func notesJSON(ns []asynqcompat.TaskNote) []noteJSON {
	out := make([]noteJSON, 0, len(ns))
	for _, n := range ns {
		out = append(out, noteJSON(n))
	}
	return out
}

// migration is one run of either command, over its types.
type migration struct {
	name       string // the command
	f          migrateFlags
	from, to   string // the source and target, as the text report names them
	jobkeyFrom bool   // the jobkey queue is the source
}

// finish prints the report of runs and returns the command's error, with
// its exit code: err is what stopped the command before or between runs.
func (m *migration) finish(stdout io.Writer, runs []typeRun, err error) error {
	dry := m.f.dryRun
	var twice, skipped bool
	for _, r := range runs {
		twice = twice || len(r.rep.Twice) > 0
		skipped = skipped || len(r.rep.Skipped) > 0
		if r.err != nil && err == nil {
			err = &exitError{exitStopped, fmt.Errorf("%s stopped at type %q: %w; rerun the same command to go on", m.name, r.typ, r.err)}
		}
	}
	switch {
	case err != nil:
	case twice:
		err = &exitError{exitTwice, errRunTwice}
	case skipped:
		err = &exitError{exitLeft, errMigrateUnfinished}
	}
	if m.f.json {
		out := migrateJSON{Command: m.name, AsynqQueue: m.f.asynqQueue, JobkeyQueue: m.f.queue, DryRun: dry,
			Types: []typeJSON{}, ExitCode: exitCode(err)}
		if err != nil {
			out.Error = err.Error()
		}
		for _, r := range runs {
			t := typeJSON{Type: r.typ, Moved: r.rep.Moved, AlreadyMoved: r.rep.AlreadyMoved, WouldMove: r.rep.WouldMove,
				Passes: r.rep.Passes, Skipped: notesJSON(r.rep.Skipped), Left: notesJSON(r.rep.Left),
				Undone: notesJSON(r.rep.Undone), Twice: notesJSON(r.rep.Twice)}
			if r.err != nil {
				t.Error = r.err.Error()
			}
			out.Types = append(out.Types, t)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(out); jerr != nil && err == nil {
			err = jerr
		}
		return err
	}
	printReport(stdout, runs, m.from, m.to)
	return err
}

// run checks the names, then moves each type in turn with move, and stops
// at the first type whose run fails.
func (m *migration) run(ctx context.Context, stdout, stderr io.Writer,
	move func(context.Context, *jobkey.Queue, redis.UniversalClient, string, func(asynqcompat.MigrateProgress)) (asynqcompat.MigrateReport, error)) error {
	openQ, qExists, rdb, err := m.f.open(ctx, !m.jobkeyFrom)
	if err != nil {
		return m.finish(stdout, nil, err)
	}
	defer rdb.Close()
	var q *jobkey.Queue
	if qExists {
		if q, err = openQ(); err != nil {
			return m.finish(stdout, nil, err)
		}
	}
	ins := asynq.NewInspectorFromRedisClient(rdb)
	exists, err := asynqQueueExists(ins, m.f.asynqQueue)
	if err != nil {
		return m.finish(stdout, nil, err)
	}
	if !exists && !m.jobkeyFrom {
		return m.finish(stdout, nil, &exitError{exitNoQueue, fmt.Errorf("asynq queue %q does not exist: nothing to move", m.f.asynqQueue)})
	}
	unknown, err := unknownTypes(ctx, ins, m.f.asynqQueue, exists, q, m.f.types)
	if err != nil {
		return m.finish(stdout, nil, err)
	}
	if len(unknown) > 0 {
		return m.finish(stdout, nil, &exitError{exitRefused, fmt.Errorf("%s refused: neither asynq queue %q nor jobkey queue %q holds a task of type %s: check -type; nothing was written",
			m.name, m.f.asynqQueue, m.f.queue, strings.Join(quoteAll(unknown), ", "))})
	}
	if q == nil {
		if q, err = openQ(); err != nil {
			return m.finish(stdout, nil, err)
		}
	}
	var runs []typeRun
	for _, typ := range m.f.types {
		progress, done := bar(stderr)
		rep, err := move(ctx, q, rdb, typ, progress)
		done()
		switch {
		case errors.Is(err, asynqcompat.ErrMigrationRunning):
			return m.finish(stdout, runs, &exitError{exitLocked, fmt.Errorf("%s refused: %w", m.name, err)})
		case errors.Is(err, asynqcompat.ErrJobkeyQueueBusy):
			return m.finish(stdout, runs, &exitError{exitBusy, fmt.Errorf("%s refused: %w", m.name, err)})
		}
		runs = append(runs, typeRun{typ: typ, rep: rep, err: err})
		if err != nil {
			break
		}
	}
	return m.finish(stdout, runs, nil)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// direction is what tells the two commands apart; the rest of a run is
// the same both ways.
type direction struct {
	name                  string
	asynqFlag, jobkeyFlag string // the names of the queue flags
	pauseHelp             string
	jobkeyFrom            bool // the jobkey queue is the source
	move                  func(ctx context.Context, rdb redis.UniversalClient, f *migrateFlags, q *jobkey.Queue, typ string, p func(asynqcompat.MigrateProgress)) (asynqcompat.MigrateReport, error)
}

var (
	intoJobkey = direction{name: "migrate-asynq", asynqFlag: "from-queue", jobkeyFlag: "to",
		pauseHelp: "pause the asynq queue (every type in it) while tasks move, so no asynq server starts one mid-move",
		move: func(ctx context.Context, rdb redis.UniversalClient, f *migrateFlags, q *jobkey.Queue, typ string, p func(asynqcompat.MigrateProgress)) (asynqcompat.MigrateReport, error) {
			return asynqcompat.Migrate(ctx, rdb, asynqcompat.MigrateOpts{FromQueue: f.asynqQueue, Type: typ, To: q,
				DryRun: f.dryRun, PauseQueue: f.pause, Concurrency: f.concurrency, Progress: p, Wait: f.wait,
				MinReplicas: q.Config().MinReplicas, ReplicaTimeout: q.Config().ReplicaTimeout})
		}}
	intoAsynq = direction{name: "migrate-to-asynq", asynqFlag: "to-queue", jobkeyFlag: "from", jobkeyFrom: true,
		pauseHelp: "pause the asynq queue (every type in it) while jobs move into it, so no asynq server starts one before the run ends",
		move: func(ctx context.Context, rdb redis.UniversalClient, f *migrateFlags, q *jobkey.Queue, typ string, p func(asynqcompat.MigrateProgress)) (asynqcompat.MigrateReport, error) {
			return asynqcompat.MigrateToAsynq(ctx, rdb, asynqcompat.RollbackOpts{From: q, Type: typ, ToQueue: f.asynqQueue,
				DryRun: f.dryRun, PauseQueue: f.pause, Concurrency: f.concurrency, Progress: p, Wait: f.wait,
				MinReplicas: q.Config().MinReplicas, ReplicaTimeout: q.Config().ReplicaTimeout})
		}}
)

// command runs one direction's command.
func (d direction) command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	m := &migration{name: d.name, jobkeyFrom: d.jobkeyFrom}
	if err := m.f.parse(m.name, args, stderr, d.asynqFlag, d.jobkeyFlag, d.pauseHelp); err != nil {
		return refused(err)
	}
	asynqQ, jobkeyQ := fmt.Sprintf("asynq queue %q", m.f.asynqQueue), fmt.Sprintf("jobkey queue %q", m.f.queue)
	m.from, m.to = asynqQ, jobkeyQ
	if d.jobkeyFrom {
		m.from, m.to = jobkeyQ, asynqQ
	}
	return m.run(ctx, stdout, stderr, func(ctx context.Context, q *jobkey.Queue, rdb redis.UniversalClient, typ string, p func(asynqcompat.MigrateProgress)) (asynqcompat.MigrateReport, error) {
		return d.move(ctx, rdb, &m.f, q, typ, p)
	})
}

// migrateAsynqCmd moves types' waiting asynq tasks into a jobkey queue.
func migrateAsynqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return intoJobkey.command(ctx, args, stdout, stderr)
}

// migrateToAsynqCmd moves types' pending jobkey jobs back into asynq.
func migrateToAsynqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return intoAsynq.command(ctx, args, stdout, stderr)
}

// refused gives a flag error its exit code; -h stays as it is.
func refused(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &exitError{exitRefused, err}
}
