package asynqcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
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
	// Concurrency is how many jobs move at once (default 8).
	Concurrency int
	// Progress, when set, is called as the run advances, from one
	// goroutine at a time. Total is 0: jobkey's listing is paged, and the
	// count of jobs of one type is not known ahead.
	Progress func(MigrateProgress)

	// afterEnqueue, in tests, runs between a job's enqueue into asynq and
	// its delete from jobkey; an error stops the run there.
	afterEnqueue func(id string) error
	// lockTTL, in tests, replaces the migration lock's lifetime.
	lockTTL time.Duration
	// now, in tests, replaces this host's clock.
	now func() time.Time
}

// MigrateToAsynq moves the pending jobs of one type from a jobkey queue
// back into an asynq queue: the rollback of Migrate. Each job keeps its ID
// (as the asynq TaskID), type, payload, run time (ProcessAt) and remaining
// attempts (MaxRetry = MaxAttempts - Attempt - 1, at least 0) and Timeout
// (asynq.Timeout, rounded up to whole seconds, which is what asynq keeps).
// A job without a Timeout of its own gets asynq's default, 30 minutes:
// asynq has no task without one (WorkOpts.Timeout does not travel).
//
// Each move enqueues into asynq first and only then deletes the job from
// jobkey, with Queue.DeleteIn(StatePending): only while it is still
// pending. A run stopped anywhere is rerun safely: asynq's
// ErrTaskIDConflict for a task of the same type and payload means an
// earlier run enqueued it, and the job is deleted from jobkey
// (MigrateReport.AlreadyMoved); an asynq task of another type or payload
// under that ID is never touched, and the job is skipped. A job that left
// jobkey's pending state after the listing (a jobkey worker claimed or
// finished it, or it was canceled or deleted) stays as it is in jobkey;
// its asynq copy is deleted again while it still waits in asynq
// (MigrateReport.Undone), else both run (MigrateReport.Twice). Stop the
// type's jobkey workers, or Pause the queue, to rule that out.
//
// A run (but a dry run) holds the migration lock of the asynq queue
// ToQueue, as Migrate does: one migration of an asynq queue runs at a
// time, in either direction.
//
// Active jobs are left to finish in jobkey and listed in
// MigrateReport.Left; finished jobs stay where they are. So is a pending
// job whose run, canceled earlier, may still be stopping (it was retried
// before that run's lease ended): jobkey keeps its ID until that lease
// ends, so that no job enqueued again under it runs beside that handler.
// It is listed in Left, with when the lease ends; a rerun after that moves
// it. A job with a
// ConcurrencyKey stays in jobkey and is listed in MigrateReport.Skipped:
// asynq has no per-key limit to carry it to.
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
	b := &backMover{ins: asynq.NewInspectorFromRedisClient(rdb), cli: asynq.NewClientFromRedisClient(rdb), opts: opts}
	b.m = &mover{rep: &rep, opts: MigrateOpts{Progress: opts.Progress}}
	if !opts.DryRun {
		var unlock func(*error)
		ctx, _, unlock, err = lockQueue(ctx, rdb, opts.ToQueue, opts.lockTTL)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate to asynq: %w", err)
		}
		defer unlock(&err)
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
	ins  *asynq.Inspector
	cli  *asynq.Client
	opts RollbackOpts
	m    *mover // the report and progress
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
	retries := max(j.MaxAttempts-j.Attempt-1, 0)
	opts := []asynq.Option{asynq.TaskID(j.ID), asynq.Queue(b.opts.ToQueue), asynq.MaxRetry(retries)}
	if j.RunAt.After(time.Now()) {
		opts = append(opts, asynq.ProcessAt(j.RunAt))
	}
	if j.Timeout > 0 {
		// asynq keeps whole seconds, truncated: round up, so that the
		// timeout is never shorter, nor 0 (asynq's default).
		opts = append(opts, asynq.Timeout((j.Timeout + time.Second - 1).Truncate(time.Second)))
	}
	_, err := b.cli.EnqueueContext(ctx, asynq.NewTask(j.Type, j.Payload), opts...)
	already := false
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		var ti *asynq.TaskInfo
		gerr := safe(func() (err error) { ti, err = b.ins.GetTaskInfo(b.opts.ToQueue, j.ID); return err })
		if gerr != nil {
			return fmt.Errorf("asynqcompat: migrate to asynq: job %q: asynq holds its ID; read that task: %w", j.ID, gerr)
		}
		if ti == nil || ti.Type != j.Type || !bytes.Equal(ti.Payload, j.Payload) {
			b.m.note(&b.m.rep.Skipped, TaskNote{ID: j.ID, State: "pending",
				Reason: fmt.Sprintf("asynq queue %q holds another task under this ID", b.opts.ToQueue)})
			return nil
		}
		already = true
	case err != nil && ctx.Err() != nil:
		// asynq does not wrap the context's error.
		return fmt.Errorf("asynqcompat: migrate to asynq: enqueue job %q into asynq: %v: %w", j.ID, err, context.Cause(ctx))
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate to asynq: enqueue job %q into asynq: %w", j.ID, err)
	}
	if b.opts.afterEnqueue != nil {
		if err := b.opts.afterEnqueue(j.ID); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Delete the job only while it is still pending: the listing may be
	// stale, and a job a jobkey worker ran (or is running) since must not
	// be deleted as if moved.
	err = b.opts.From.DeleteIn(ctx, j.ID, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil:
	case errors.As(err, &se) && !se.Running.IsZero():
		// Still pending, but a canceled run of it may still be stopping.
		return b.undo(j, se.State.String(), stopping(se.Running), &b.m.rep.Left)
	case errors.As(err, &se):
		return b.undo(j, se.State.String(), left(se.State.String()), &b.m.rep.Undone)
	case errors.Is(err, jobkey.ErrNotFound):
		// It left jobkey by itself since it was listed.
		return b.undo(j, "gone", left("gone"), &b.m.rep.Undone)
	default:
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q is in asynq; delete it from jobkey queue %q: %w (rerun to finish the move)", j.ID, b.opts.From.Name(), err)
	}
	if already {
		b.m.count(&b.m.rep.AlreadyMoved)
	} else {
		b.m.count(&b.m.rep.Moved)
	}
	return nil
}

func (b *backMover) now() time.Time {
	if b.opts.now != nil {
		return b.opts.now()
	}
	return time.Now()
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

// undo handles a job that jobkey would not delete after its asynq copy was
// enqueued: it left jobkey's pending state between its listing and its
// delete (a jobkey worker took it, or it was canceled or deleted), or a
// canceled run of it may still be stopping. Its asynq copy goes while it
// still waits in asynq, so the job runs once, in jobkey, and is noted in
// into with what. A copy asynq took already runs in both
// (MigrateReport.Twice).
func (b *backMover) undo(j *jobkey.Job, st, what string, into *[]TaskNote) error {
	q := b.opts.ToQueue
	var ti *asynq.TaskInfo
	err := safe(func() (err error) { ti, err = b.ins.GetTaskInfo(q, j.ID); return err })
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), err == nil && ti == nil:
		b.m.note(&b.m.rep.Twice, TaskNote{ID: j.ID, State: st, Reason: what + ", and its asynq copy is gone: asynq ran it too"})
		return nil
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q stays in jobkey (%s); read its asynq copy: %w", j.ID, what, err)
	case !waiting(ti.State.String()):
		b.m.note(&b.m.rep.Twice, TaskNote{ID: j.ID, State: st, Reason: fmt.Sprintf("%s, and its asynq copy is %s: it runs in both", what, ti.State)})
		return nil
	}
	err = safe(func() error { return b.ins.DeleteTask(q, j.ID) })
	if err == nil {
		b.m.note(into, TaskNote{ID: j.ID, State: st, Reason: what + "; its asynq copy was deleted again"})
		return nil
	}
	if gerr := safe(func() (err error) { ti, err = b.ins.GetTaskInfo(q, j.ID); return err }); errors.Is(gerr, asynq.ErrTaskNotFound) || (gerr == nil && !waiting(ti.State.String())) {
		b.m.note(&b.m.rep.Twice, TaskNote{ID: j.ID, State: st, Reason: what + ", and asynq took its copy too: it runs in both"})
		return nil
	}
	return fmt.Errorf("asynqcompat: migrate to asynq: job %q stays in jobkey (%s); delete its asynq copy: %w", j.ID, what, err)
}
