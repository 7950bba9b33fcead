package asynqcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// MigrateOpts configure Migrate.
type MigrateOpts struct {
	// FromQueue is the asynq queue to move tasks out of (default "default").
	FromQueue string
	// Type is the task type to move (required). Tasks of other types are
	// read, to find this type's, and never written.
	Type string
	// To is the jobkey queue the tasks move into (required).
	To *jobkey.Queue
	// DryRun lists and classifies the tasks without writing anything.
	DryRun bool
	// PauseQueue pauses the asynq queue (Inspector.PauseQueue) while tasks
	// move, so no asynq server starts a task during the move, and resumes
	// it afterwards unless it was paused before. Pausing holds back every
	// type of the queue for the run. Without it, each move reads the task
	// in asynq again between its enqueue into jobkey and its delete from
	// asynq, and a task asynq took or finished since the listing has its
	// jobkey copy deleted again while still pending (MigrateReport.Undone);
	// see MigrateReport.Twice for when that is too late. One window stays
	// open without it: asynq taking and completing a task between that
	// read and the delete, in a queue whose Retention keeps completed
	// tasks, is not seen, and the task is counted as moved and runs in
	// jobkey too.
	PauseQueue bool
	// Concurrency is how many tasks move at once (default 8).
	Concurrency int
	// PageSize is how many tasks one asynq listing call reads (default 500).
	PageSize int
	// Progress, when set, is called as the run advances, from one
	// goroutine at a time.
	Progress func(MigrateProgress)

	// afterEnqueue, in tests, runs between a task's enqueue and its delete;
	// an error stops the run there, as a crash would.
	afterEnqueue func(id string) error
	// lockTTL, in tests, replaces the migration lock's lifetime.
	lockTTL time.Duration
}

// MigrateProgress says how far a run is.
type MigrateProgress struct {
	Phase string // "listing" or "moving"
	Pass  int    // the pass, from 1: a run lists again until a pass moves nothing
	Done  int    // tasks listed (listing) or handled (moving) so far in this pass
	Total int    // tasks to handle in this pass; 0 while listing
}

// TaskNote names a task (or job) and what the run found about it.
type TaskNote struct {
	ID     string
	State  string // where it was: asynq's state name, or jobkey's
	Reason string
}

// MigrateReport says what a run did. A run makes passes: each lists the
// waiting tasks of the type and moves them, and the run stops after a pass
// that moved nothing, so tasks that changed state while it listed are
// caught by the next pass. Skipped, Left, Undone and Twice describe the
// tasks where the run left them.
type MigrateReport struct {
	// Moved counts the tasks this run enqueued and then deleted from the
	// source.
	Moved int
	// AlreadyMoved counts tasks found in the target already, with the same
	// type and payload (an earlier run stopped between enqueue and delete),
	// that this run deleted from the source.
	AlreadyMoved int
	// WouldMove counts, in a dry run, the tasks a run would move.
	WouldMove int
	// Skipped lists the tasks that cannot move, with the reason; they stay
	// in the source as they are.
	Skipped []TaskNote
	// Left lists the tasks that are running in the source: left to finish
	// there. Moving to asynq, it lists too the pending jobkey jobs whose
	// canceled run may still be stopping: left in jobkey until that run's
	// lease ends.
	Left []TaskNote
	// Undone lists the tasks that the source started running, or ran,
	// after they were listed and before their delete: the run deleted the
	// target's copy, still pending, again (or found none), so the task runs
	// once, in the source. State is where the source held it then ("gone"
	// when the source no longer had it).
	Undone []TaskNote
	// Twice lists the tasks that the source started running, or ran,
	// after they were listed, and whose copy the target had already claimed
	// too: they run in both. Run with PauseQueue (or with the type's
	// workers stopped in the source) to rule this out.
	Twice []TaskNote
	// Passes is how many listing passes the run made.
	Passes int
	// DryRun tells that nothing was written.
	DryRun bool
}

func (o *MigrateOpts) defaults() error {
	if o.FromQueue == "" {
		o.FromQueue = "default"
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	switch {
	case strings.TrimSpace(o.Type) == "":
		return errors.New("asynqcompat: migrate: Type is required")
	case o.To == nil:
		return errors.New("asynqcompat: migrate: To (the jobkey queue) is required")
	}
	return nil
}

// Migrate moves the asynq tasks of one type that wait in one asynq queue
// (pending, scheduled and retry) into a jobkey queue. Each task keeps its
// ID (asynq's task ID becomes the jobkey ID), type, payload, run time
// (NextProcessAt becomes RunAt), remaining retries (MaxAttempts =
// MaxRetry - Retried + 1, at least 1) and Timeout (jobkey's Job.Timeout,
// applied by Work to each run as asynq's server does). asynq stores a
// Timeout with every task it enqueues without a Deadline, its default of 30
// minutes when none was given, and that is what the job gets; a task that
// stores none (a Timeout under a second, which asynq truncates to 0) gets
// those 30 minutes too, as asynq's server would apply them.
//
// Each move enqueues into jobkey first and only then deletes the task from
// asynq. A run stopped anywhere (ctx canceled, the process killed, Redis
// unreachable) is rerun safely: a task whose ID jobkey already holds with
// the same type and payload was moved by the earlier run, and is deleted
// from asynq (MigrateReport.AlreadyMoved). A jobkey job under that ID with
// another type or payload is never overwritten: the task is skipped.
//
// Tasks that cannot move are skipped with a reason and stay in asynq: an ID
// jobkey refuses (empty, longer than jobkey.MaxIDLen, or with '{' or '}'),
// headers (jobkey jobs have none), a Deadline (jobkey has none: it is an
// absolute time across all runs and retries), a Timeout negative or over
// jobkey.MaxTimeout, a job too large for the queue. Tasks active in asynq
// are left to finish there and
// listed in MigrateReport.Left; archived, completed and aggregating tasks
// are not read.
//
// The listing a pass works from may be stale when a task's turn comes: a
// task is deleted from asynq only if asynq still holds it pending,
// scheduled or retry after its enqueue into jobkey, and a task asynq took
// or ran since (or that asynq's delete no longer finds) has its jobkey
// copy deleted again with Queue.DeleteIn(StatePending) and is listed in
// MigrateReport.Undone, never counted as moved. See PauseQueue for the
// window that stays.
//
// A run (but a dry run) holds the asynq queue's migration lock, a Redis
// key, for its whole length, renewed while it runs: a second Migrate or
// MigrateToAsynq of the same asynq queue refuses to start with a
// *MigrationRunningError (errors.Is ErrMigrationRunning). A run that loses
// the lock stops with an error that wraps ErrLockLost, and leaves a queue
// it paused paused.
//
// rdb is the Redis asynq uses (asynq keeps its keys under "asynq:"). The
// report tells what was done so far even when err is not nil.
func Migrate(ctx context.Context, rdb redis.UniversalClient, opts MigrateOpts) (rep MigrateReport, err error) {
	rep = MigrateReport{DryRun: opts.DryRun}
	if err := opts.defaults(); err != nil {
		return rep, err
	}
	if rdb == nil {
		return rep, errors.New("asynqcompat: migrate: no Redis client")
	}
	m := &mover{ins: asynq.NewInspectorFromRedisClient(rdb), opts: opts, rep: &rep}
	if !opts.DryRun {
		var lock *queueLock
		var unlock func(*error)
		ctx, lock, unlock, err = lockQueue(ctx, rdb, opts.FromQueue, opts.lockTTL)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate: %w", err)
		}
		defer unlock(&err)
		if opts.PauseQueue {
			resume, perr := m.pause()
			if perr != nil {
				return rep, perr
			}
			defer resume(lock, &err)
		}
	}
	for pass := 1; ; pass++ {
		rep.Passes = pass
		m.resetNotes()
		tasks, err := m.list(ctx, pass)
		if err != nil {
			return rep, err
		}
		before := rep.Moved + rep.AlreadyMoved + rep.WouldMove
		err = runAll(ctx, opts.Concurrency, len(tasks), func(ctx context.Context, i int) error {
			err := m.move(ctx, tasks[i])
			m.progress(MigrateProgress{Phase: "moving", Pass: pass, Total: len(tasks)}, 1)
			return err
		})
		if err != nil {
			return rep, err
		}
		if opts.DryRun || rep.Moved+rep.AlreadyMoved == before {
			return rep, nil
		}
	}
}

// lockQueue takes the migration lock of an asynq queue for one run. The
// returned context is canceled when the lock is lost; unlock releases the
// lock and, when it was lost, makes the run's error wrap ErrLockLost.
func lockQueue(ctx context.Context, rdb redis.UniversalClient, queue string, ttl time.Duration) (context.Context, *queueLock, func(*error), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	l, err := acquireLock(ctx, rdb, queue, ttl, cancel)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	return ctx, l, func(errp *error) {
		l.release()
		cancel(nil)
		switch lost := l.Lost(); {
		case lost == nil, errors.Is(*errp, ErrLockLost):
		case *errp == nil:
			*errp = lost
		default:
			*errp = fmt.Errorf("%w; the run stopped: %w", lost, *errp)
		}
	}, nil
}

// mover carries one Migrate run.
type mover struct {
	ins  *asynq.Inspector
	opts MigrateOpts

	mu   sync.Mutex
	rep  *MigrateReport
	done int // progress within the phase
}

func (m *mover) resetNotes() {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Undone and Twice record what happened, and stay; Skipped and Left say
	// where tasks stand, as the last pass found them.
	m.rep.Skipped, m.rep.Left = nil, nil
	m.done = 0
}

func (m *mover) note(list *[]TaskNote, n TaskNote) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*list = append(*list, n)
}

func (m *mover) count(c *int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*c++
}

func (m *mover) progress(p MigrateProgress, step int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done += step
	if m.opts.Progress != nil {
		p.Done = m.done
		m.opts.Progress(p)
	}
}

// pause pauses the asynq queue; resume unpauses it unless it was paused
// already, and only while the run holds the queue's migration lock: a run
// that lost it leaves the queue paused (another run may rely on the pause)
// and says so in *errp.
func (m *mover) pause() (resume func(l *queueLock, errp *error), err error) {
	var info *asynq.QueueInfo
	if err := safe(func() (err error) { info, err = m.ins.GetQueueInfo(m.opts.FromQueue); return err }); err != nil {
		return nil, fmt.Errorf("asynqcompat: migrate: asynq queue %q: %w", m.opts.FromQueue, err)
	}
	if info.Paused {
		return func(*queueLock, *error) {}, nil
	}
	if err := safe(func() error { return m.ins.PauseQueue(m.opts.FromQueue) }); err != nil {
		return nil, fmt.Errorf("asynqcompat: migrate: pause asynq queue %q: %w", m.opts.FromQueue, err)
	}
	return func(l *queueLock, errp *error) {
		if lost := l.Lost(); lost != nil {
			*errp = errors.Join(*errp, fmt.Errorf("%w; asynq queue %q is left paused: unpause it (asynq queue unpause %s) once no migration of it runs", lost, m.opts.FromQueue, m.opts.FromQueue))
			return
		}
		_ = safe(func() error { return m.ins.UnpauseQueue(m.opts.FromQueue) })
	}, nil
}

// list reads the waiting tasks of the type, each once, and notes the
// active ones.
func (m *mover) list(ctx context.Context, pass int) ([]*asynq.TaskInfo, error) {
	q := m.opts.FromQueue
	seen := map[string]bool{}
	var out []*asynq.TaskInfo
	listers := []struct {
		name string
		fn   func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	}{
		{"active", m.ins.ListActiveTasks},
		{"pending", m.ins.ListPendingTasks},
		{"scheduled", m.ins.ListScheduledTasks},
		{"retry", m.ins.ListRetryTasks},
	}
	for _, l := range listers {
		for page := 1; ; page++ {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var infos []*asynq.TaskInfo
			err := safe(func() (err error) {
				infos, err = l.fn(q, asynq.Page(page), asynq.PageSize(m.opts.PageSize))
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("asynqcompat: migrate: list %s tasks of asynq queue %q: %w", l.name, q, err)
			}
			for _, ti := range infos {
				if ti == nil || ti.Type != m.opts.Type || seen[ti.ID] {
					continue
				}
				seen[ti.ID] = true
				if l.name == "active" {
					m.note(&m.rep.Left, TaskNote{ID: ti.ID, State: "active", Reason: "running in asynq: left to finish there"})
					continue
				}
				out = append(out, ti)
			}
			m.progress(MigrateProgress{Phase: "listing", Pass: pass}, len(infos))
			if len(infos) < m.opts.PageSize {
				break
			}
		}
	}
	m.mu.Lock()
	m.done = 0
	m.mu.Unlock()
	return out, nil
}

// asynqDefaultTimeout is the Timeout asynq gives a task enqueued with
// neither Timeout nor Deadline, and what its server applies to a task that
// stores neither.
const asynqDefaultTimeout = 30 * time.Minute

// why says why a task cannot move into jobkey, or "".
func (m *mover) why(ti *asynq.TaskInfo) string {
	switch {
	case ti.ID == "" || len(ti.ID) > jobkey.MaxIDLen:
		return fmt.Sprintf("task ID is %d bytes; jobkey takes 1..%d", len(ti.ID), jobkey.MaxIDLen)
	case strings.ContainsAny(ti.ID, "{}"):
		return "task ID contains '{' or '}', which jobkey IDs may not (they would break the cluster hash tag)"
	case len(ti.Headers) > 0:
		return fmt.Sprintf("task has %d headers; jobkey jobs have none", len(ti.Headers))
	case !ti.Deadline.IsZero():
		return fmt.Sprintf("task has a Deadline (%s); jobkey has no per-job deadline", ti.Deadline.UTC().Format("2006-01-02T15:04:05Z"))
	case ti.Timeout < 0:
		return fmt.Sprintf("task has a negative Timeout (%v); jobkey takes 0..%v", ti.Timeout, jobkey.MaxTimeout)
	case ti.Timeout > jobkey.MaxTimeout:
		return fmt.Sprintf("task has a Timeout of %v, over jobkey's MaxTimeout, %v", ti.Timeout, jobkey.MaxTimeout)
	}
	return ""
}

// move moves one task: enqueue into jobkey, then delete from asynq.
func (m *mover) move(ctx context.Context, ti *asynq.TaskInfo) error {
	state := ti.State.String()
	if reason := m.why(ti); reason != "" {
		m.note(&m.rep.Skipped, TaskNote{ID: ti.ID, State: state, Reason: reason})
		return nil
	}
	if m.opts.DryRun {
		m.count(&m.rep.WouldMove)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	eo := &jobkey.EnqueueOpts{ID: ti.ID, RunAt: ti.NextProcessAt, MaxAttempts: max(ti.MaxRetry-ti.Retried+1, 1), Timeout: ti.Timeout}
	if eo.Timeout == 0 {
		// Neither Timeout nor Deadline stored: asynq's server applies its
		// default (why skipped the tasks with a Deadline).
		eo.Timeout = asynqDefaultTimeout
	}
	if eo.MaxAttempts > jobkey.MaxAttemptsLimit {
		eo.MaxAttempts = jobkey.MaxAttemptsLimit
	}
	j, err := m.opts.To.Enqueue(ctx, ti.Type, ti.Payload, eo)
	already := false
	switch {
	case errors.Is(err, jobkey.ErrJobExists):
		if j == nil || j.Type != ti.Type || !bytes.Equal(j.Payload, ti.Payload) {
			m.note(&m.rep.Skipped, TaskNote{ID: ti.ID, State: state,
				Reason: fmt.Sprintf("jobkey queue %q holds another job under this ID", m.opts.To.Name())})
			return nil
		}
		already = true
	case errors.Is(err, jobkey.ErrTooLarge), errors.Is(err, jobkey.ErrInvalid):
		m.note(&m.rep.Skipped, TaskNote{ID: ti.ID, State: state, Reason: err.Error()})
		return nil
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate: enqueue task %q into jobkey: %w", ti.ID, err)
	}
	if m.opts.afterEnqueue != nil {
		if err := m.opts.afterEnqueue(ti.ID); err != nil {
			return err
		}
	}
	// A run stopped here leaves the task in both; the rerun finds it in
	// jobkey and deletes it from asynq.
	if err := ctx.Err(); err != nil {
		return err
	}
	// The listing may be stale: asynq may have run the task since, and
	// even finished it (and, without retention, deleted it). Delete it
	// from asynq only while it still waits there; else the jobkey copy
	// goes again.
	st, err := m.asynqState(ti.ID)
	switch {
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate: task %q is in jobkey; read it in asynq queue %q: %w (rerun to finish the move)", ti.ID, m.opts.FromQueue, err)
	case !waiting(st):
		return m.undo(ctx, ti, st)
	}
	err = safe(func() error { return m.ins.DeleteTask(m.opts.FromQueue, ti.ID) })
	switch {
	case err == nil:
	case errors.Is(err, asynq.ErrTaskNotFound):
		// It left asynq by itself since it was read: asynq ran it.
		return m.undo(ctx, ti, "gone")
	default:
		if st, gerr := m.asynqState(ti.ID); gerr == nil && !waiting(st) {
			return m.undo(ctx, ti, st)
		}
		return fmt.Errorf("asynqcompat: migrate: task %q is in jobkey; delete it from asynq queue %q: %w (rerun to finish the move)", ti.ID, m.opts.FromQueue, err)
	}
	if already {
		m.count(&m.rep.AlreadyMoved)
	} else {
		m.count(&m.rep.Moved)
	}
	return nil
}

// asynqState reads the state of a task in the asynq queue: asynq's state
// name, or "gone" when asynq no longer has it (it ran it and, keeping no
// completed tasks, deleted it).
func (m *mover) asynqState(id string) (string, error) {
	var ti *asynq.TaskInfo
	err := safe(func() (err error) { ti, err = m.ins.GetTaskInfo(m.opts.FromQueue, id); return err })
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), err == nil && ti == nil:
		return "gone", nil
	case err != nil:
		return "", err
	}
	return ti.State.String(), nil
}

// waiting says whether an asynq state is one a task waits in to run.
func waiting(state string) bool {
	switch state {
	case asynq.TaskStatePending.String(), asynq.TaskStateScheduled.String(), asynq.TaskStateRetry.String():
		return true
	}
	return false
}

// undo handles a task that left asynq's waiting states between its
// listing and its delete (asynq is running it, or ran it): its jobkey
// copy goes while still pending, so the task runs once, in asynq. A copy
// a jobkey worker took already runs in both (MigrateReport.Twice).
func (m *mover) undo(ctx context.Context, ti *asynq.TaskInfo, st string) error {
	what := "asynq started it during the move"
	if st != asynq.TaskStateActive.String() {
		what = fmt.Sprintf("asynq ran it during the move (now %s there)", st)
	}
	err := m.opts.To.DeleteIn(ctx, ti.ID, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil:
		m.note(&m.rep.Undone, TaskNote{ID: ti.ID, State: st, Reason: what + "; its jobkey copy was deleted again"})
		return nil
	case errors.Is(err, jobkey.ErrNotFound) && st == asynq.TaskStateActive.String():
		m.note(&m.rep.Left, TaskNote{ID: ti.ID, State: st, Reason: "running in asynq: left to finish there"})
		return nil
	case errors.Is(err, jobkey.ErrNotFound):
		m.note(&m.rep.Undone, TaskNote{ID: ti.ID, State: st, Reason: what + "; it has no jobkey copy"})
		return nil
	case errors.As(err, &se):
		m.note(&m.rep.Twice, TaskNote{ID: ti.ID, State: st,
			Reason: fmt.Sprintf("%s, and its jobkey copy is %s: it runs in both", what, se.State)})
		return nil
	}
	return fmt.Errorf("asynqcompat: migrate: task %q left asynq's waiting states during its move; remove its pending jobkey copy: %w", ti.ID, err)
}

// safe runs f and turns a panic inside asynq (it panics on some states it
// reads from Redis) into an error.
func safe(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("asynqcompat: asynq panicked: %v", r)
		}
	}()
	return f()
}

// runAll calls f for 0..n-1 on up to conc goroutines and returns the first
// error; after it, no new call starts.
func runAll(ctx context.Context, conc, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel(err) })
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}
