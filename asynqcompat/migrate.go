package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	// PauseQueue pauses the asynq queue (as Inspector.PauseQueue does)
	// while tasks move, and the run resumes it when done. It pauses it
	// first, before it finishes the moves a stopped run left. The migration
	// state records that a migration paused it, in the same transaction: a
	// rerun after a crash resumes it (with or without PauseQueue), and a
	// queue an operator paused is never resumed. Pausing holds back every
	// type of the queue for the run. Moves do not need it to run each task
	// once (the jobkey copy is held until the asynq task is deleted, and
	// that delete happens only while the task waits, under WATCH); it keeps
	// asynq from taking tasks of the type while they move, which would then
	// stay in asynq (MigrateReport.Undone).
	PauseQueue bool
	// Concurrency is how many tasks move at once (default 8).
	Concurrency int
	// PageSize is how many tasks one asynq listing call reads (default 500).
	PageSize int
	// Progress, when set, is called as the run advances, from one
	// goroutine at a time.
	Progress func(MigrateProgress)

	// Wait is how long a run waits for the queue's migration lock when
	// another run holds it (default 0: refuse at once). A crashed run's
	// lock ends at most 6 seconds after it died.
	Wait time.Duration

	// MinReplicas makes each of the run's own writes (to asynq's keys,
	// to the migration state beside them, and to its claim of the jobkey
	// queue) wait, before the move takes its next step, until this many
	// replicas of the node that applied it confirm it: WAIT, sent after
	// the write's EXEC in the same round trip. A write they do not confirm
	// within ReplicaTimeout stops the run with a *ReplicationError
	// (errors.Is ErrNotReplicated) that names the task; rerun once the
	// replicas are back. The writes to the jobkey queue go through To and
	// wait as its Config.MinReplicas says (default: To's
	// Config.MinReplicas; -1: no wait).
	MinReplicas int
	// ReplicaTimeout bounds each wait for MinReplicas (default: To's
	// Config.ReplicaTimeout; from 1ms to 1 minute).
	ReplicaTimeout time.Duration

	// afterEnqueue, in tests, runs between a task's enqueue and its delete;
	// an error stops the run there.
	afterEnqueue func(id string) error
	// crashAt, in tests, runs at each named step of each move (the at*
	// constants); an error wrapping errCrash stops the run there as a
	// SIGKILL would.
	crashAt func(point, id string) error
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
	// AlreadyMoved counts the moves an earlier run began and stopped
	// before their end (recorded in the migration state), that this run
	// finished; and tasks found in the target already, with the same type
	// and payload, that this run deleted from the source.
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
	// after they were listed and before their move switched them over:
	// they stay in the source and run once there. Moving into jobkey, the
	// held jobkey copy was deleted (or none was made); moving into asynq,
	// nothing was put into asynq. State is where the source held it then
	// ("gone" when the source no longer had it).
	Undone []TaskNote
	// Twice lists the tasks that run in both systems. Moves never make one
	// (the target's copy is held until the source is gone); it lists a
	// task found in the target already, due, and taken there, while the
	// source ran it too.
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
// MaxRetry - Retried + 1, at least 1), the retries spent
// (Meta[MetaRetried] = Retried, which asynq.GetRetryCount goes on from),
// the asynq queue (Meta[MetaQueue] = FromQueue), Timeout (jobkey's Job.Timeout,
// applied by Work to each run as asynq's server does), Deadline (Job.Deadline,
// which ends every run at that time, as asynq's does) and Retention
// (Job.Retention: how long the job is kept once it succeeded). asynq stores a
// Timeout with every task it enqueues without a Deadline, its default of 30
// minutes when none was given, and that is what the job gets; a task that
// stores neither (a Timeout under a second, which asynq truncates to 0) gets
// those 30 minutes too, as asynq's server would apply them.
//
// Each move is recorded in the asynq queue's migration state (one Redis
// value, written by WATCH/MULTI/EXEC) before it writes anything, and goes
// in steps: enqueue into jobkey a held copy (not due before the year 9999),
// delete the task from asynq only while it still waits there, in one
// transaction under WATCH of the task that also records the step, then
// make the jobkey copy due at the task's own run time. A task that asynq
// took or ran before that delete stays in asynq, and its held copy, which
// nothing could claim, is deleted (MigrateReport.Undone). No task can run
// in both systems, whenever the run stops. A run stopped anywhere (ctx
// canceled, the process killed, Redis unreachable) is finished by the next
// run of the same asynq queue, in either direction: it reads the state
// first and finishes each recorded move from its step
// (MigrateReport.AlreadyMoved). A jobkey job under the task's ID with
// another type or payload is never overwritten: the task is skipped.
//
// The task's last error (asynq's LastErr) becomes the job's LastError.
//
// No option is dropped: a task with one jobkey cannot carry is skipped,
// listed in MigrateReport.Skipped with the option's name and the reason,
// and stays in asynq as it is: an ID jobkey refuses (empty, longer than
// jobkey.MaxIDLen, or with '{' or '}'), headers (jobkey jobs have none), a
// Deadline before 1970 or after 9999, a Retention over
// jobkey.MaxRetention, a Group (jobkey
// has no aggregation; the tasks aggregating in a group are listed too), a
// unique lock it still holds (asynq.Unique: deleting the task would
// release the lock, and jobkey has no uniqueness by state to take it
// over), a Timeout negative or over jobkey.MaxTimeout, a job too large for
// the queue, a Meta that with the retry count and queue name would exceed
// jobkey's limits on Meta. Tasks active in asynq are left to finish there
// and listed in MigrateReport.Left; archived and completed tasks are not
// read.
//
// The listing a pass works from may be stale when a task's turn comes: the
// delete from asynq is what decides, as above, and it deletes the task only
// as listed. A task asynq ran, failed and put back to wait for a retry
// since (its retry count, last error or failure time differ) is not
// deleted: its held copy, made from the listing, would give it the retries
// it spent again. The copy is deleted, and the next pass moves the task.
//
// With MinReplicas (by default To's Config.MinReplicas), each write of a
// move waits for the replicas of the master that applied it before the
// move's next step, so that a failover between two steps, whichever master
// it takes, loses at most the last step whole and leaves no task in both
// systems or in neither; see MigrateOpts.MinReplicas.
//
// A run (but a dry run) holds the asynq queue's migration lock, a Redis
// key, for its whole length, renewed while it runs: a second Migrate or
// MigrateToAsynq of the same asynq queue refuses to start with a
// *MigrationRunningError (errors.Is ErrMigrationRunning), or waits up to
// Wait for it. A killed run's lock ends within 6 seconds. The run then
// claims the jobkey queue To for its asynq queue: a migration through
// another asynq queue that runs on To, or stopped with moves in it
// unfinished, makes it refuse with a *JobkeyQueueBusyError (errors.Is
// ErrJobkeyQueueBusy), or wait up to Wait while that one runs. A run that loses
// the lock stops with an error that wraps ErrLockLost, and leaves a queue
// it paused paused, for the next run to resume.
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
	m := &mover{rdb: rdb, ins: asynq.NewInspectorFromRedisClient(rdb), opts: opts, rep: &rep}
	if !opts.DryRun {
		// err is the named result, which finish below reports into.
		var dur durability
		dur, err = durabilityOf(rdb, opts.To, opts.MinReplicas, opts.ReplicaTimeout)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate: %w", err)
		}
		var ses *session
		var finish func(*error)
		ctx, ses, finish, err = startSession(ctx, rdb, opts.FromQueue, opts.To, opts.lockTTL, opts.Wait, dur)
		if err != nil {
			return rep, fmt.Errorf("asynqcompat: migrate: %w", err)
		}
		defer finish(&err)
		m.sh = &shifter{st: ses.st, q: opts.To, m: m,
			hook: opts.crashAt, after: opts.afterEnqueue}
		// Paused first: the moves a stopped run left are moves too.
		if opts.PauseQueue {
			if err := ses.st.pause(ctx); err != nil {
				return rep, fmt.Errorf("asynqcompat: migrate: pause asynq queue %q: %w", opts.FromQueue, err)
			}
		}
		if err := m.sh.recoverMoves(ctx); err != nil {
			return rep, err
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
		again := m.takeAgain()
		if opts.DryRun || rep.Moved+rep.AlreadyMoved == before && !again {
			return rep, nil
		}
	}
}

// mover carries one Migrate run.
type mover struct {
	rdb  redis.UniversalClient
	ins  *asynq.Inspector
	opts MigrateOpts
	sh   *shifter // the moves; nil in a dry run

	mu    sync.Mutex
	rep   *MigrateReport
	done  int  // progress within the phase
	again bool // a move left its task to the next pass (passAgain)
}

// passAgain makes the run list the tasks once more after this pass,
// whatever the pass moved: a move left its task for the next pass to move.
func (m *mover) passAgain() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.again = true
}

// takeAgain reports, and clears, what passAgain set.
func (m *mover) takeAgain() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	again := m.again
	m.again = false
	return again
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
	if err := m.noteAggregating(ctx, pass); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.done = 0
	m.mu.Unlock()
	return out, nil
}

// noteAggregating lists in MigrateReport.Skipped the tasks of the type that
// wait in an asynq group to be aggregated: they stay in asynq, which alone
// can aggregate them.
func (m *mover) noteAggregating(ctx context.Context, pass int) error {
	q := m.opts.FromQueue
	var groups []*asynq.GroupInfo
	err := safe(func() (err error) { groups, err = m.ins.Groups(q); return err })
	if err != nil {
		return fmt.Errorf("asynqcompat: migrate: list the groups of asynq queue %q: %w", q, err)
	}
	for _, g := range groups {
		if g == nil {
			continue
		}
		for page := 1; ; page++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			var infos []*asynq.TaskInfo
			err := safe(func() (err error) {
				infos, err = m.ins.ListAggregatingTasks(q, g.Group, asynq.Page(page), asynq.PageSize(m.opts.PageSize))
				return err
			})
			if err != nil {
				return fmt.Errorf("asynqcompat: migrate: list the tasks of group %q of asynq queue %q: %w", g.Group, q, err)
			}
			for _, ti := range infos {
				if ti == nil || ti.Type != m.opts.Type {
					continue
				}
				m.note(&m.rep.Skipped, TaskNote{ID: ti.ID, State: ti.State.String(), Reason: groupReason(g.Group)})
			}
			m.progress(MigrateProgress{Phase: "listing", Pass: pass}, len(infos))
			if len(infos) < m.opts.PageSize {
				break
			}
		}
	}
	return nil
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
	case !ti.Deadline.IsZero() && (ti.Deadline.Year() < 1970 || ti.Deadline.Year() > 9999 || ti.Deadline.Unix() == 0):
		return fmt.Sprintf("Deadline (%s) outside what jobkey stores: after the Unix epoch, within 9999", ti.Deadline.UTC().Format(time.RFC3339))
	case ti.Retention > jobkey.MaxRetention:
		return fmt.Sprintf("Retention (%v) over jobkey's MaxRetention, %v", ti.Retention, jobkey.MaxRetention)
	case ti.Group != "":
		return groupReason(ti.Group)
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
	locked, err := uniqueLocked(ctx, m.rdb, m.opts.FromQueue, ti.ID)
	if err != nil {
		return fmt.Errorf("asynqcompat: migrate: task %q: read its unique lock: %w", ti.ID, err)
	}
	if locked != "" {
		m.note(&m.rep.Skipped, TaskNote{ID: ti.ID, State: state, Reason: uniqueReason(locked)})
		return nil
	}
	// The retries spent and the asynq queue travel in Meta, so that the
	// handler's asynq.GetRetryCount goes on from where asynq left it.
	meta, reason := carryMeta(nil, ti.Retried, m.opts.FromQueue)
	if reason != "" {
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
	eo := &jobkey.EnqueueOpts{ID: ti.ID, MaxAttempts: max(ti.MaxRetry-ti.Retried+1, 1), Timeout: ti.Timeout, Meta: meta,
		Deadline: ti.Deadline}
	if ti.Retention > 0 {
		eo.Retention = max(ti.Retention, time.Second) // asynq keeps whole seconds
	}
	if eo.Timeout == 0 && eo.Deadline.IsZero() {
		// Neither Timeout nor Deadline stored: asynq's server applies its
		// default. With a Deadline alone it applies the Deadline only.
		eo.Timeout = asynqDefaultTimeout
	}
	if eo.MaxAttempts > jobkey.MaxAttemptsLimit {
		eo.MaxAttempts = jobkey.MaxAttemptsLimit
	}
	runAt := ti.NextProcessAt
	if runAt.IsZero() {
		runAt = time.Now()
	}
	rec := &moveRec{Dir: dirToJobkey, Step: stepEnqueue, JobkeyQueue: m.opts.To.Name(), Type: ti.Type, RunAt: runAt.UTC().Truncate(time.Millisecond),
		LastErr: cutError(ti.LastErr), Retried: ti.Retried}
	if !ti.LastFailedAt.IsZero() {
		rec.LastFailedAt = ti.LastFailedAt.Unix()
	}
	if err := m.sh.st.begin(ctx, ti.ID, *rec); err != nil {
		return fmt.Errorf("asynqcompat: migrate: task %q: %w", ti.ID, err)
	}
	return m.sh.toJobkey(ctx, ti.ID, rec, ti, eo)
}

// groupReason says why a task of an asynq group stays in asynq.
func groupReason(group string) string {
	return fmt.Sprintf("Group (%q): jobkey has no aggregation; moved, the task would run alone, outside its group", group)
}

// uniqueLocked returns the key of the asynq unique lock (asynq.Unique) that
// task id of the asynq queue holds, or "" when it holds none: it was
// enqueued without Unique, or its lock expired or went to another task.
func uniqueLocked(ctx context.Context, rdb redis.UniversalClient, queue, id string) (string, error) {
	key, err := rdb.HGet(ctx, asynqTaskKey(queue, id), "unique_key").Result()
	if errors.Is(err, redis.Nil) || err == nil && key == "" {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	holder, err := rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) || err == nil && holder != id {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return key, nil
}

// uniqueReason says why a task that holds its unique lock stays in asynq.
func uniqueReason(key string) string {
	return fmt.Sprintf("Unique: jobkey has no uniqueness by state yet; the task stays in asynq, holding its unique lock %q", key)
}

// cutError cuts an asynq task's last error to what a jobkey job holds
// (jobkey.MaxErrorLen), at a UTF-8 boundary.
func cutError(s string) string {
	n := jobkey.MaxErrorLen
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// carryMeta returns a copy of meta with the retries a task spent in asynq
// (MetaRetried) and its asynq queue (MetaQueue) added, or the reason the
// result would exceed jobkey's limits on Meta.
func carryMeta(meta map[string]string, retried int, queue string) (map[string]string, string) {
	out := make(map[string]string, len(meta)+2)
	maps.Copy(out, meta)
	out[MetaRetried] = strconv.Itoa(max(retried, 0))
	out[MetaQueue] = queue
	n := 0
	for k, v := range out {
		n += len(k) + len(v)
	}
	switch {
	case len(out) > jobkey.MaxMetaEntries:
		return nil, fmt.Sprintf("with the asynq retry count and queue name, the job's Meta would have %d entries; jobkey takes %d", len(out), jobkey.MaxMetaEntries)
	case n > jobkey.MaxMetaBytes:
		return nil, fmt.Sprintf("with the asynq retry count and queue name, the job's Meta would hold %d bytes; jobkey takes %d", n, jobkey.MaxMetaBytes)
	}
	return out, ""
}

// waiting says whether an asynq state is one a task waits in to run.
func waiting(state string) bool {
	switch state {
	case asynq.TaskStatePending.String(), asynq.TaskStateScheduled.String(), asynq.TaskStateRetry.String():
		return true
	}
	return false
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
