package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/asynqcompat"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
)

// errMigrateUnfinished makes a migration exit non-zero when tasks stay
// behind that the operator must look at.
var errMigrateUnfinished = errors.New("some tasks did not move: see the lists above")

// migrateFlags are the flags both directions share.
type migrateFlags struct {
	redisURL, prefix, typ, asynqQueue, queue string
	dryRun                                   bool
	concurrency                              int
	wait                                     time.Duration
}

func (m *migrateFlags) parse(name string, args []string, stderr io.Writer, asynqFlag, jobkeyFlag string, extra func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&m.redisURL, "redis", "", "Redis URL of asynq and of jobkey, required (default: $REDIS_URL)")
	fs.StringVar(&m.asynqQueue, asynqFlag, "default", "the asynq queue")
	fs.StringVar(&m.typ, "type", "", "the task type to move (required)")
	fs.StringVar(&m.queue, jobkeyFlag, "", "the jobkey queue (required)")
	fs.StringVar(&m.prefix, "prefix", "jobkey", "key prefix of the jobkey queue")
	fs.BoolVar(&m.dryRun, "dry-run", false, "list what would move; write nothing")
	fs.IntVar(&m.concurrency, "concurrency", 8, "tasks moved at once")
	fs.DurationVar(&m.wait, "wait", 0, "wait up to this long for another migration of the asynq queue (or a killed one's lock, which ends within 6s) instead of refusing")
	if extra != nil {
		extra(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if m.redisURL == "" {
		m.redisURL = os.Getenv("REDIS_URL")
	}
	switch {
	case m.typ == "":
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

// open connects and opens the jobkey queue: with the shard count it
// stored, or, when it does not exist yet, with the defaults.
func (m *migrateFlags) open(ctx context.Context) (*jobkey.Queue, redis.UniversalClient, func(), error) {
	rdb, err := connect(ctx, m.redisURL)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg := &jobkey.Config{Prefix: m.prefix}
	shards, err := jobkey.LookupShards(ctx, rdb, m.prefix, m.queue)
	switch {
	case err == nil:
		cfg.Shards = shards
	case errors.Is(err, jobkey.ErrNotFound):
	default:
		rdb.Close()
		return nil, nil, nil, err
	}
	q, err := jobkey.NewQueue(rdb, m.queue, cfg)
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	return q, rdb, func() { rdb.Close() }, nil
}

// bar shows a run's progress on stderr: one bar per phase and pass.
func bar(stderr io.Writer) (func(asynqcompat.MigrateProgress), func()) {
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

// printReport prints what a run moved, skipped and left.
func printReport(stdout io.Writer, rep asynqcompat.MigrateReport, from, to string) error {
	if rep.DryRun {
		fmt.Fprintf(stdout, "dry run: %d tasks would move from %s to %s; nothing was written\n", rep.WouldMove, from, to)
	} else {
		fmt.Fprintf(stdout, "moved %d tasks from %s to %s (and finished %d moves an earlier, stopped run had begun) in %d passes\n",
			rep.Moved, from, to, rep.AlreadyMoved, rep.Passes)
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
	if len(rep.Skipped)+len(rep.Twice) > 0 {
		return errMigrateUnfinished
	}
	return nil
}

// migrateAsynqCmd moves a type's waiting asynq tasks into a jobkey queue.
func migrateAsynqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f migrateFlags
	var pause bool
	err := f.parse("migrate-asynq", args, stderr, "from-queue", "to", func(fs *flag.FlagSet) {
		fs.BoolVar(&pause, "pause", false, "pause the asynq queue (every type in it) while tasks move, so no asynq server starts one mid-move")
	})
	if err != nil {
		return err
	}
	q, rdb, closeQ, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer closeQ()
	progress, done := bar(stderr)
	rep, err := asynqcompat.Migrate(ctx, rdb, asynqcompat.MigrateOpts{FromQueue: f.asynqQueue, Type: f.typ, To: q,
		DryRun: f.dryRun, PauseQueue: pause, Concurrency: f.concurrency, Progress: progress, Wait: f.wait})
	done()
	if errors.Is(err, asynqcompat.ErrMigrationRunning) {
		return fmt.Errorf("migrate-asynq refused: %w", err)
	}
	perr := printReport(stdout, rep, fmt.Sprintf("asynq queue %q", f.asynqQueue), fmt.Sprintf("jobkey queue %q", f.queue))
	if err != nil {
		return fmt.Errorf("migrate-asynq stopped: %w; rerun the same command to go on", err)
	}
	return perr
}

// migrateToAsynqCmd moves a type's pending jobkey jobs back into asynq.
func migrateToAsynqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f migrateFlags
	if err := f.parse("migrate-to-asynq", args, stderr, "to-queue", "from", nil); err != nil {
		return err
	}
	q, rdb, closeQ, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer closeQ()
	progress, done := bar(stderr)
	rep, err := asynqcompat.MigrateToAsynq(ctx, rdb, asynqcompat.RollbackOpts{From: q, Type: f.typ, ToQueue: f.asynqQueue,
		DryRun: f.dryRun, Concurrency: f.concurrency, Progress: progress, Wait: f.wait})
	done()
	if errors.Is(err, asynqcompat.ErrMigrationRunning) {
		return fmt.Errorf("migrate-to-asynq refused: %w", err)
	}
	perr := printReport(stdout, rep, fmt.Sprintf("jobkey queue %q", f.queue), fmt.Sprintf("asynq queue %q", f.asynqQueue))
	if err != nil {
		return fmt.Errorf("migrate-to-asynq stopped: %w; rerun the same command to go on", err)
	}
	return perr
}
