package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// RollbackOpts configure MigrateToAsynq.
type RollbackOpts struct {
	// From is the jobkey queue to move jobs out of (required).
	From *jobkey.Queue
	// Type is the job type to move (required).
	Type string
	// ToQueue is the asynq queue the jobs move into (default "default").
	ToQueue string
	// DryRun lists the jobs without writing anything.
	DryRun bool
	// PauseQueue pauses the asynq queue ToQueue (every type in it) while
	// jobs move, and the run resumes it when done, with the same record as
	// MigrateOpts.PauseQueue: it pauses it first, before it finishes the
	// moves a stopped run left; a rerun after a crash resumes a queue a
	// migration paused, and never one an operator paused. No asynq server
	// then starts a moved task before the run ends.
	PauseQueue bool
	// Concurrency is how many jobs move at once (default 8).
	Concurrency int
	// Progress, when set, is called as the run advances, from one
	// goroutine at a time. Total is 0: jobkey's listing is paged, and the
	// count of jobs of one type is not known ahead.
	Progress func(MigrateProgress)

	// Wait is how long a run waits for the queue's migration lock when
	// another run holds it (default 0: refuse at once).
	Wait time.Duration

	// MinReplicas and ReplicaTimeout make each of the run's own writes
	// (the asynq copies, the migration state, the claim of From) wait for
	// replicas, as MigrateOpts's do (default: From's Config.MinReplicas
	// and Config.ReplicaTimeout; MinReplicas -1: no wait).
	MinReplicas    int
	ReplicaTimeout time.Duration

	// afterEnqueue, in tests, runs between a job's enqueue into asynq and
	// its delete from jobkey; an error stops the run there.
	afterEnqueue func(id string) error
	// crashAt, in tests, runs at each named step of each move; an error
	// wrapping errCrash stops the run there as a SIGKILL would.
	crashAt func(point, id string) error
	// lockTTL, in tests, replaces the migration lock's lifetime.
	lockTTL time.Duration
	// now, in tests, replaces this host's clock.
	now func() time.Time
}

// MigrateToAsynq moves the pending jobs of one type from a jobkey queue
// back into an asynq queue: the rollback of Migrate. Each job keeps its ID
// (as the asynq TaskID), type, payload, run time (ProcessAt), its retry
// count (Retried = Meta[MetaRetried] + Attempt: the retries spent in both
// systems), remaining attempts (MaxRetry = Meta[MetaRetried] + MaxAttempts
// - 1, so that it has MaxAttempts - Attempt runs left, at least one, as in
// jobkey), Timeout
// (asynq.Timeout, rounded up to whole seconds, which is what asynq keeps),
// Retention (asynq.Retention, rounded up to whole seconds) and Deadline
// (asynq.Deadline, which asynq truncates to whole seconds).
// A job with neither a Timeout of its own nor a Deadline gets asynq's
// default timeout, 30 minutes: asynq has no task without one
// (WorkOpts.Timeout does not travel).
//
// Each move is recorded in the asynq queue's migration state first, as
// Migrate's are, and goes in steps: hold the jobkey job (its RunAt set to
// the year 9999 by Queue.Update, only while it is pending with no canceled
// run that may still be stopping, by Redis's clock), enqueue its asynq copy
// scheduled for that year too, make that copy due at the job's run time in
// one transaction that records the step, then delete the held job from
// jobkey. A job a jobkey worker claimed (or that was canceled or deleted)
// before the hold stays in jobkey, and nothing is put into asynq
// (MigrateReport.Undone). No job can run in both systems, whenever the run
// stops; the next run of the asynq queue, in either direction, finishes the
// moves a stopped run recorded (MigrateReport.AlreadyMoved). An asynq task
// of another type or payload under the ID is never touched: the job is made
// due again in jobkey and skipped.
//
// A run (but a dry run) holds the migration lock of the asynq queue
// ToQueue, as Migrate does: one migration of an asynq queue runs at a
// time, in either direction; and it claims the jobkey queue From, as
// Migrate claims To (see there).
//
// The asynq copy is written by the run itself, as asynq's Client would
// enqueue it, in the transaction that records it: the job's LastError
// becomes the task's LastErr (asynq's Client has no option for it), with
// the job's last write as LastFailedAt. A copy that is gone when the move
// makes it due was run by hand (Inspector.RunTask) and finished, or
// deleted: it is not written again, and the held jobkey job is deleted
// (MigrateReport.Undone).
//
// Active jobs are left to finish in jobkey and listed in
// MigrateReport.Left; finished jobs stay where they are. So is a pending
// job whose run, canceled earlier, may still be stopping (it was retried
// before that run's lease ended): jobkey keeps its ID until that lease
// ends, so that no job enqueued again under it runs beside that handler.
// It is listed in Left, with when the lease ends; a rerun after that moves
// it.
//
// No option is dropped: a job with one asynq cannot carry stays in jobkey,
// listed in MigrateReport.Skipped with the option's name and the reason: a
// ConcurrencyKey (asynq has no per-key limit), a Priority above 0 (asynq
// has no per-task priority, only queue weights), Meta entries other than
// MetaRetried and MetaQueue, such as a trace context (an asynq task has
// nowhere its handler would read them).
func MigrateToAsynq(ctx context.Context, rdb redis.UniversalClient, opts RollbackOpts) (rep MigrateReport, err error) {
	rep = MigrateReport{DryRun: opts.DryRun}
	switch {
	case opts.From == nil:
		return rep, errors.New("asynqcompat: migrate to asynq: From (the jobkey queue) is required")
	case strings.TrimSpace(opts.Type) == "":
		return rep, errors.New("asynqcompat: migrate to asynq: Type is required")
	case rdb == nil:
		return rep, errors.New("asynqcompat: migrate to asynq: no Redis client")
	}
	if opts.ToQueue == "" {
		opts.ToQueue = "default"
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	b := &backMover{opts: opts}
	b.m = &mover{rep: &rep, opts: MigrateOpts{Progress: opts.Progress}}
	if !opts.DryRun {
		// err is the named result, which finish below reports into.
		var dur durability
		dur, err = durabilityOf(rdb, opts.From, opts.MinReplicas, opts.ReplicaTimeout)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate to asynq: %w", err)
		}
		var ses *session
		var finish func(*error)
		ctx, ses, finish, err = startSession(ctx, rdb, opts.ToQueue, opts.From, opts.lockTTL, opts.Wait, dur)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate to asynq: %w", err)
		}
		defer finish(&err)
		b.sh = &shifter{st: ses.st, q: opts.From, m: b.m, hook: opts.crashAt, after: opts.afterEnqueue}
		// Paused first: the moves a stopped run left are moves too.
		if opts.PauseQueue {
			if err := ses.st.pause(ctx); err != nil {
				return rep, fmt.Errorf("asynqcompat: migrate to asynq: pause asynq queue %q: %w", opts.ToQueue, err)
			}
		}
		if err := b.sh.recoverMoves(ctx); err != nil {
			return rep, err
		}
	}
	for pass := 1; ; pass++ {
		rep.Passes = pass
		b.m.resetNotes()
		before := rep.Moved + rep.AlreadyMoved
		if err := b.pass(ctx, pass); err != nil {
			return rep, err
		}
		if opts.DryRun || rep.Moved+rep.AlreadyMoved == before {
			return rep, nil
		}
	}
}

type backMover struct {
	opts RollbackOpts
	m    *mover   // the report and progress
	sh   *shifter // the moves; nil in a dry run
}

// pass walks the pending jobs of the type page by page and moves each; the
// listing's keyset cursor stays valid while listed jobs are deleted.
func (b *backMover) pass(ctx context.Context, pass int) error {
	q := b.opts.From
	if err := b.noteActive(ctx); err != nil {
		return err
	}
	cursor := ""
	for {
		// Without List's Type filter: with it, a page's later reads shrink,
		// and List gives up on many entries that share one millisecond
		// (jobs of one EnqueueMany batch). move keeps the type's jobs.
		page, err := q.List(ctx, jobkey.ListOpts{State: jobkey.StatePending, Limit: jobkey.MaxListLimit, Cursor: cursor})
		if err != nil {
			return fmt.Errorf("asynqcompat: migrate to asynq: list pending jobs of queue %q: %w", q.Name(), err)
		}
		for _, u := range page.Unreadable {
			b.m.note(&b.m.rep.Skipped, TaskNote{ID: u.ID, State: "unreadable", Reason: u.Err.Error()})
		}
		jobs := page.Jobs
		err = runAll(ctx, b.opts.Concurrency, len(jobs), func(ctx context.Context, i int) error {
			err := b.move(ctx, jobs[i])
			b.m.progress(MigrateProgress{Phase: "moving", Pass: pass}, 1)
			return err
		})
		if err != nil {
			return err
		}
		if page.Next == "" {
			return nil
		}
		cursor = page.Next
	}
}

// noteActive lists the type's active jobs in MigrateReport.Left.
func (b *backMover) noteActive(ctx context.Context) error {
	cursor := ""
	for {
		page, err := b.opts.From.List(ctx, jobkey.ListOpts{State: jobkey.StateActive, Limit: jobkey.MaxListLimit, Cursor: cursor})
		if err != nil {
			return fmt.Errorf("asynqcompat: migrate to asynq: list active jobs of queue %q: %w", b.opts.From.Name(), err)
		}
		for _, j := range page.Jobs {
			if j.Type != b.opts.Type {
				continue
			}
			b.m.note(&b.m.rep.Left, TaskNote{ID: j.ID, State: "active", Reason: "running in jobkey: left to finish there"})
		}
		if page.Next == "" {
			return nil
		}
		cursor = page.Next
	}
}

func (b *backMover) move(ctx context.Context, j *jobkey.Job) error {
	if j.Type != b.opts.Type || j.State != jobkey.StatePending {
		return nil // the listing's filter, kept
	}
	if j.ConcurrencyKey != "" {
		// asynq has no limit per key: moved, the job would run unlimited.
		// Like an option with no equivalent, it is never dropped.
		b.m.note(&b.m.rep.Skipped, TaskNote{ID: j.ID, State: "pending",
			Reason: fmt.Sprintf("concurrency key %q: asynq has no per-key limit, so the job stays in jobkey", j.ConcurrencyKey)})
		return nil
	}
	if _, ok := j.Meta[metaHeldRunAt]; ok && j.RunAt.Equal(holdUntil) && !b.opts.DryRun {
		// Held by a move into asynq that no state records (recover finished
		// this queue's moves, and the claim keeps other queues' out): a run
		// that lost its lock held it late. It gets its RunAt back, and is
		// moved as any other.
		r, err := b.sh.releaseAbandonedHold(ctx, j)
		switch {
		case errors.Is(err, errNotHeld), errors.Is(err, jobkey.ErrNotFound):
			return nil // changed since it was listed: the next pass sees it as it is
		case errors.Is(err, errUnreadableMark):
			// Data that cannot be decoded is reported and kept: the job
			// stays held in jobkey, and the other jobs move.
			b.m.note(&b.m.rep.Skipped, TaskNote{ID: j.ID, State: "pending",
				Reason: err.Error() + ": the job is kept held in jobkey; set its RunAt with Queue.Update to move it"})
			return nil
		case err != nil:
			return fmt.Errorf("asynqcompat: migrate to asynq: job %q: give its abandoned hold its RunAt back: %w", j.ID, err)
		}
		j = r
	}
	if reason := whyNotToAsynq(j); reason != "" {
		b.m.note(&b.m.rep.Skipped, TaskNote{ID: j.ID, State: "pending", Reason: reason})
		return nil
	}
	if now := b.now(); j.LeaseUntil.After(now) {
		// Judged again, by Redis's clock, by DeleteIn below: this host's
		// clock only spares the asynq copy that would be deleted again.
		b.m.note(&b.m.rep.Left, TaskNote{ID: j.ID, State: j.State.String(),
			Reason: stopping(j.LeaseUntil) + ": left in jobkey, which keeps its ID until then; rerun after that to move it"})
		return nil
	}
	if b.opts.DryRun {
		b.m.count(&b.m.rep.WouldMove)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The hold judges a canceled run's lease by Redis's clock, as jobkey
	// does: this host's clock only spared the copy above.
	now, err := b.sh.st.rdb.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("asynqcompat: migrate to asynq: read Redis's clock: %w", err)
	}
	rec := &moveRec{Dir: dirToAsynq, Step: stepHold, JobkeyQueue: b.opts.From.Name(), Type: j.Type, RunAt: j.RunAt}
	if j.LastError != "" {
		// The failure's time, as near as jobkey keeps it: the job's last
		// write, which set its LastError.
		rec.LastFailedAt = j.UpdatedAt.Unix()
	}
	if err := b.sh.st.begin(ctx, j.ID, *rec); err != nil {
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q: %w", j.ID, err)
	}
	return b.sh.toAsynq(ctx, j.ID, rec, j, now)
}

func (b *backMover) now() time.Time {
	if b.opts.now != nil {
		return b.opts.now()
	}
	return time.Now()
}

// whyNotToAsynq says why a pending job cannot move into asynq without
// losing one of its options, or "": it then stays in jobkey.
func whyNotToAsynq(j *jobkey.Job) string {
	if j.Priority != 0 {
		return fmt.Sprintf("Priority (%d): asynq has no per-task priority, only queue weights, so the job stays in jobkey", j.Priority)
	}
	var own []string
	for k, v := range j.Meta {
		if k == metaHeldRunAt && isHoldMark(v) {
			continue // a hold's mark left by a release by hand: the move's own
		}
		if k != MetaRetried && k != MetaQueue {
			own = append(own, k)
		}
	}
	if len(own) > 0 {
		slices.Sort(own)
		return fmt.Sprintf("Meta (%s): an asynq task has nowhere its handler reads these entries, so the job stays in jobkey", strings.Join(quoteAll(own), ", "))
	}
	return ""
}

// isHoldMark says whether v, the value of Meta[metaHeldRunAt], is a
// hold's mark (a RunAt): any other value is the caller's own entry, which
// a move into asynq would drop.
func isHoldMark(v string) bool {
	_, err := time.Parse(time.RFC3339Nano, v)
	return err == nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

// stopping says why a pending job whose canceled run may still be stopping
// stays in jobkey.
func stopping(until time.Time) string {
	return fmt.Sprintf("a run of it canceled in jobkey may still be stopping until %s", until.Format(time.RFC3339Nano))
}

// left says how a job left jobkey's pending state during its move; st is
// its state there now, or "gone".
func left(st string) string {
	if st == jobkey.StateActive.String() {
		return "jobkey started it during the move"
	}
	return fmt.Sprintf("it left jobkey's pending state during the move (now %s there)", st)
}
