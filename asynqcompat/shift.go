package asynqcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// errCrash, returned by a test's crash hook, stands in for a SIGKILL: the
// run stops where it is, leaves its lock to expire, and resumes nothing.
var errCrash = errors.New("asynqcompat: simulated crash")

// Crash points, in the order a move passes them (see state.go).
const (
	atBeforeEnqueue = "before-enqueue" // the move is recorded (into asynq: the jobkey job is held)
	atAfterEnqueue  = "after-enqueue"  // the held copy is in the target
	atAfterReread   = "after-reread"   // the source was read again under WATCH, before the EXEC that switches
	atAfterDelete   = "after-delete"   // into jobkey: the asynq task is deleted; into asynq: the jobkey job is deleted
	atAfterRelease  = "after-release"  // the target copy is due
	// atHeldChecked: into asynq, the held jobkey job was read again and
	// found held, before the EXEC that makes the asynq copy due.
	atHeldChecked = "held-checked"
)

// session is one run's hold of an asynq queue: its migration lock and
// state.
type session struct {
	st   *stateStore
	lock *queueLock
}

// startSession takes the migration lock of an asynq queue. The returned
// context is canceled when the lock is lost; finish, deferred with the
// run's error, resumes the queue if a migration paused it and releases the
// lock, and says in *errp what it could not do. dur is what the session's
// writes (its state, asynq's keys, the claim) wait for.
func startSession(ctx context.Context, rdb redis.UniversalClient, queue string, q *jobkey.Queue, ttl, wait time.Duration, dur durability) (context.Context, *session, func(*error), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	start := time.Now()
	l, err := acquireLock(ctx, rdb, queue, ttl, wait, cancel)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	// Then the jobkey queue: no migration through another asynq queue may
	// have moves in it at the same time.
	if err := claimQueue(ctx, rdb, q, queue, wait-time.Since(start), dur); err != nil {
		l.release()
		cancel(nil)
		return nil, nil, nil, err
	}
	s := &session{st: &stateStore{rdb: rdb, queue: queue, lock: l, dur: dur}, lock: l}
	return ctx, s, func(errp *error) {
		if errors.Is(*errp, errCrash) {
			l.abandon()
			cancel(nil)
			return
		}
		bg, stop := context.WithTimeout(context.Background(), 5*time.Second)
		defer stop()
		if l.Lost() == nil {
			if _, rerr := s.st.resume(bg); rerr != nil && !errors.Is(rerr, ErrLockLost) {
				*errp = errors.Join(*errp, fmt.Errorf("asynqcompat: resume asynq queue %q, which a migration paused: %w; rerun to resume it", queue, rerr))
			}
			if cerr := unclaimQueue(bg, s.st, q); cerr != nil {
				*errp = errors.Join(*errp, fmt.Errorf("asynqcompat: release the claim %q of jobkey queue %q: %w (the next migration of it takes it over)", claimKey(q), q.Name(), cerr))
			}
		}
		if st, rerr := s.st.read(bg); rerr == nil && st.Paused {
			*errp = errors.Join(*errp, fmt.Errorf("asynq queue %q is left paused, as a migration paused it: the next migration of it resumes it (or unpause it: asynq queue unpause %s, once no migration of it runs)", queue, queue))
		}
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

// shifter moves tasks between one asynq queue and one jobkey queue, one
// recorded step at a time, in either direction.
type shifter struct {
	st    *stateStore
	q     *jobkey.Queue
	m     *mover // the report
	hook  func(point, id string) error
	after func(id string) error // the tests' older hook, at atAfterEnqueue
}

func (s *shifter) at(point, id string) error {
	if point == atAfterEnqueue && s.after != nil {
		if err := s.after(id); err != nil {
			return err
		}
	}
	if s.hook != nil {
		return s.hook(point, id)
	}
	return nil
}

// recoverMoves finishes, first, every move a crashed or stopped run left
// in the state, from the step it recorded.
func (s *shifter) recoverMoves(ctx context.Context) error {
	st, err := s.st.read(ctx)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(st.Moves))
	for id := range st.Moves {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		rec := st.Moves[id]
		if rec.JobkeyQueue != s.q.Name() {
			return fmt.Errorf("asynqcompat: task %q has an unfinished move between asynq queue %q and jobkey queue %q: rerun with that jobkey queue to finish it", id, s.st.queue, rec.JobkeyQueue)
		}
		switch rec.Dir {
		case dirToJobkey:
			err = s.toJobkey(ctx, id, rec, nil, nil)
		case dirToAsynq:
			err = s.toAsynq(ctx, id, rec, nil, time.Time{})
		default:
			err = fmt.Errorf("%w: move of task %q has direction %q", ErrStateUnreadable, id, rec.Dir)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// held says whether a jobkey job is a held copy of a recorded move.
func held(j *jobkey.Job, rec *moveRec) bool {
	return j != nil && j.Type == rec.Type && j.RunAt.Equal(holdUntil) && j.State == jobkey.StatePending
}

var errNotHeld = errors.New("not held")

// errHeldElsewhere says a jobkey job is the held copy of another
// migration's move.
var errHeldElsewhere = errors.New("held by another migration's move")

// metaHeldRunAt is the Meta entry a move into asynq writes on the jobkey
// job it holds: the job's RunAt before the hold (RFC 3339, nanoseconds).
// It marks the hold as a migration's, and lets a later run give an
// abandoned hold its RunAt back.
const metaHeldRunAt = "asynqcompat.runat"

// abandonedToJobkey says whether a held jobkey job carries the marks of a
// held copy of a move into jobkey from asynq queue queue: the asynq queue
// in Meta, and no mark of a hold into asynq.
func abandonedToJobkey(j *jobkey.Job, queue string) bool {
	_, holdBack := j.Meta[metaHeldRunAt]
	return j.Meta[MetaQueue] == queue && !holdBack
}

// fenced returns nil while this run holds both its migration lock and the
// claim of its jobkey queue: then no other migration has a move under way
// with the jobkey queue, and a held copy that this run's state does not
// record (recover has finished the recorded ones) is abandoned. A run
// that lost its lock wrote it late, after a rerun had forgotten its move.
// It runs inside the CAS of the jobkey job that acts on such a copy: a
// write of the job by anyone in between fails that CAS, which reads again.
func (s *shifter) fenced(ctx context.Context) error {
	// Two GETs in one pipeline, not an MGET: the two keys carry different
	// hash tags, and a cluster refuses an MGET across slots.
	p := s.st.rdb.Pipeline()
	lock := p.Get(ctx, s.st.lock.key)
	claim := p.Get(ctx, claimKey(s.q))
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if tok := lock.Val(); tok != s.st.lock.token {
		return fmt.Errorf("%w: asynq queue %q: key %q no longer holds this run's token", ErrLockLost, s.st.queue, s.st.lock.key)
	}
	if cl := claim.Val(); cl != s.st.queue {
		return fmt.Errorf("%w: the claim %q of jobkey queue %q is no longer this migration's", ErrLockLost, claimKey(s.q), s.q.Name())
	}
	return nil
}

// adoptHeld makes an abandoned held copy of a move into jobkey (see
// abandonedToJobkey) the held copy of this run's move of the task, with
// the options this run read from asynq, in one CAS of the job, only while
// it is still held and this run still holds its lock and claim. The move
// goes on from the held copy as if this run had enqueued it: the asynq
// task, never deleted, is deleted only while it still waits.
func (s *shifter) adoptHeld(ctx context.Context, id string, rec *moveRec, eo *jobkey.EnqueueOpts) error {
	_, err := s.q.Update(ctx, id, func(c *jobkey.Job) error {
		if !held(c, rec) || !abandonedToJobkey(c, s.st.queue) {
			return errNotHeld
		}
		if err := s.fenced(ctx); err != nil {
			return err
		}
		c.Meta = eo.Meta
		c.MaxAttempts = eo.MaxAttempts
		c.Timeout = eo.Timeout
		c.Deadline = eo.Deadline
		c.Retention = eo.Retention
		return nil
	})
	if errors.Is(err, jobkey.ErrNotFound) {
		return errNotHeld
	}
	return err
}

// releaseAbandonedHold gives a jobkey job held by a move into asynq that
// no state records (a run that lost its lock held it after a rerun forgot
// its move; see fenced) its RunAt from before the hold back, in one CAS
// of the job, only while it is still that hold and this run still holds
// its lock and claim. Nothing was written to asynq for it (that write is
// fenced). It returns the job released, to be moved as listed.
func (s *shifter) releaseAbandonedHold(ctx context.Context, j *jobkey.Job) (*jobkey.Job, error) {
	mark := j.Meta[metaHeldRunAt]
	runAt, perr := time.Parse(time.RFC3339Nano, mark)
	if perr != nil {
		return nil, fmt.Errorf("%w: its hold's mark %s=%q cannot be read: %v", errUnreadableMark, metaHeldRunAt, mark, perr)
	}
	return s.q.Update(ctx, j.ID, func(c *jobkey.Job) error {
		if c.State != jobkey.StatePending || !c.RunAt.Equal(holdUntil) || c.Meta[metaHeldRunAt] != mark {
			return errNotHeld
		}
		if err := s.fenced(ctx); err != nil {
			return err
		}
		unholdJob(c, runAt)
		return nil
	})
}

// errUnreadableMark says that a held job's hold mark (metaHeldRunAt) is
// no RunAt: the job is reported and kept held, as it is.
var errUnreadableMark = errors.New("unreadable hold mark")

// holdJob holds a jobkey job for a move into asynq: never due, with its
// RunAt kept in Meta (metaHeldRunAt).
func holdJob(c *jobkey.Job) {
	meta := maps.Clone(c.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[metaHeldRunAt] = c.RunAt.UTC().Format(time.RFC3339Nano)
	c.Meta = meta
	c.RunAt = holdUntil
}

// unholdJob gives a held jobkey job its RunAt back (runAt) and drops the
// hold's mark.
func unholdJob(c *jobkey.Job, runAt time.Time) {
	if _, ok := c.Meta[metaHeldRunAt]; ok {
		meta := maps.Clone(c.Meta)
		delete(meta, metaHeldRunAt)
		if len(meta) == 0 {
			meta = nil
		}
		c.Meta = meta
	}
	c.RunAt = runAt
}

// toJobkey runs a move into jobkey from its recorded step. ti and eo are
// the task and its job options for a fresh move; nil for one recovered
// from the state.
func (s *shifter) toJobkey(ctx context.Context, id string, rec *moveRec, ti *asynq.TaskInfo, eo *jobkey.EnqueueOpts) error {
	recovered := ti == nil
	if rec.Step == stepEnqueue {
		if !recovered {
			if err := s.at(atBeforeEnqueue, id); err != nil {
				return err
			}
			state := ti.State.String()
			hold := *eo
			hold.RunAt = holdUntil
			j, err := s.q.Enqueue(ctx, ti.Type, ti.Payload, &hold)
			switch {
			case errors.Is(err, jobkey.ErrJobExists):
				if j == nil || j.Type != ti.Type || !bytes.Equal(j.Payload, ti.Payload) {
					s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: state,
						Reason: fmt.Sprintf("jobkey queue %q holds another job under this ID", s.q.Name())})
					return s.st.forget(ctx, id)
				}
				if j.RunAt.Equal(holdUntil) && abandonedToJobkey(j, s.st.queue) {
					// The held copy of a move into jobkey from this asynq
					// queue that no state records: a run that lost its lock
					// enqueued it after a rerun forgot the move. Its asynq
					// task was never deleted (that delete is fenced): this
					// move takes the copy over as its own held copy.
					if err := s.adoptHeld(ctx, id, rec, eo); err != nil {
						if errors.Is(err, errNotHeld) {
							s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: state,
								Reason: fmt.Sprintf("jobkey queue %q holds this job, changed while this move took over its abandoned held copy; rerun to move it", s.q.Name())})
							return s.st.forget(ctx, id)
						}
						return fmt.Errorf("asynqcompat: migrate: task %q: take over its abandoned held jobkey copy: %w (rerun to finish the move)", id, err)
					}
				} else if j.RunAt.Equal(holdUntil) {
					// Held, but not by a move into jobkey from this asynq
					// queue (none of this run's markers): written by hand or
					// by an older version, it is left as it is.
					s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: state,
						Reason: fmt.Sprintf("jobkey queue %q holds this job, held by another migration's move under way", s.q.Name())})
					return s.st.forget(ctx, id)
				} else {
					// The same task, enqueued due by an older run: the
					// delete below decides, as for a held copy.
					recovered = true
				}
			case errors.Is(err, jobkey.ErrTooLarge), errors.Is(err, jobkey.ErrInvalid):
				s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: state, Reason: err.Error()})
				return s.st.forget(ctx, id)
			case err != nil:
				return fmt.Errorf("asynqcompat: migrate: enqueue task %q into jobkey: %w (rerun to finish the move)", id, err)
			}
			if err := s.at(atAfterEnqueue, id); err != nil {
				return err
			}
		} else {
			j, err := s.q.Get(ctx, id)
			switch {
			case errors.Is(err, jobkey.ErrNotFound), err == nil && !held(j, rec):
				// Nothing was enqueued (or a job not ours holds the ID):
				// the task is where it was, and a pass lists it again.
				return s.st.forget(ctx, id)
			case err != nil:
				return fmt.Errorf("asynqcompat: migrate: unfinished move of task %q: read it in jobkey: %w", id, err)
			}
		}
		if rec.LastErr != "" {
			// The asynq task's last error, on the held copy before the
			// asynq task goes.
			_, err := s.q.Update(ctx, id, func(j *jobkey.Job) error {
				if !held(j, rec) {
					return errNotHeld
				}
				j.LastError = rec.LastErr
				return nil
			})
			switch {
			case errors.Is(err, errNotHeld), errors.Is(err, jobkey.ErrNotFound):
				// A copy an older run enqueued due, or none: the delete
				// below decides, as it did before.
			case errors.Is(err, jobkey.ErrTooLarge):
				return s.dropHeld(ctx, id, fmt.Sprintf("with the asynq task's last error (LastErr, %d bytes), the job would be over jobkey's value limit", len(rec.LastErr)))
			case err != nil:
				return fmt.Errorf("asynqcompat: migrate: task %q: set its held jobkey copy's LastError: %w (rerun to finish the move)", id, err)
			}
		}
		// Delete the asynq task only while it still waits, under WATCH,
		// with the step recorded in the same EXEC.
		err := s.st.deleteWaiting(ctx, id, stepRelease, func() error { return s.at(atAfterReread, id) })
		var nw *errNotWaiting
		var uh *errUniqueHeld
		var tu *errTaskUnreadable
		switch {
		case errors.As(err, &nw):
			return s.undoToJobkey(ctx, id, nw.state)
		case errors.As(err, &uh):
			return s.dropHeld(ctx, id, uniqueReason(uh.key))
		case errors.Is(err, errTaskChanged):
			return s.relist(ctx, id)
		case errors.As(err, &tu):
			return s.dropHeld(ctx, id, fmt.Sprintf("its asynq task message cannot be decoded (%v): kept in asynq as it is", tu.err))
		case err != nil:
			return fmt.Errorf("asynqcompat: migrate: task %q: delete it from asynq queue %q: %w (rerun to finish the move)", id, s.st.queue, err)
		}
		if err := s.at(atAfterDelete, id); err != nil {
			return err
		}
	}
	// The asynq task is gone: make the jobkey copy due.
	_, err := s.q.Update(ctx, id, func(j *jobkey.Job) error {
		if !held(j, rec) {
			return errNotHeld
		}
		j.RunAt = rec.RunAt
		return nil
	})
	switch {
	case errors.Is(err, errNotHeld):
	case errors.Is(err, jobkey.ErrNotFound):
		s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: "gone",
			Reason: "deleted from asynq by the move, and its held jobkey copy was deleted by someone else before it was made due"})
		return s.st.forget(ctx, id)
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate: task %q is out of asynq; make its jobkey copy due: %w (rerun to finish the move)", id, err)
	}
	return s.moved(ctx, atAfterRelease, id, recovered)
}

// dropHeld ends a move into jobkey before the asynq task is touched: the
// task stays in asynq (listed in Skipped with reason), and its held jobkey
// copy, which nothing could claim, is deleted.
func (s *shifter) dropHeld(ctx context.Context, id, reason string) error {
	err := s.q.DeleteIn(ctx, id, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil, errors.Is(err, jobkey.ErrNotFound):
		s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: "waiting", Reason: reason})
	case errors.As(err, &se):
		// Only a copy enqueued due, by a run older than the migration
		// state, can have been claimed.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: "waiting",
			Reason: fmt.Sprintf("%s, and its jobkey copy is %s: it runs in both", reason, se.State)})
	default:
		return fmt.Errorf("asynqcompat: migrate: task %q stays in asynq (%s); delete its held jobkey copy: %w (rerun to finish)", id, reason, err)
	}
	return s.st.forget(ctx, id)
}

// relist ends a move into jobkey whose asynq task asynq ran, failed and
// put back to wait for a retry after the move listed it: its held copy,
// made from the task as listed, would run it again with the retries it has
// spent since. The held copy, which nothing could claim, goes; the task,
// untouched in asynq, is moved by the run's next pass, from what it is
// now.
func (s *shifter) relist(ctx context.Context, id string) error {
	err := s.q.DeleteIn(ctx, id, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil, errors.Is(err, jobkey.ErrNotFound):
	case errors.As(err, &se):
		// Only a copy enqueued due, by a run older than the migration
		// state, can have been claimed.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: "retry",
			Reason: fmt.Sprintf("asynq ran it during the move, and its jobkey copy is %s: it runs in both", se.State)})
		return s.st.forget(ctx, id)
	default:
		return fmt.Errorf("asynqcompat: migrate: task %q ran in asynq since it was listed; delete its held jobkey copy, made from the task as listed: %w (rerun to finish)", id, err)
	}
	s.m.passAgain()
	return s.st.forget(ctx, id)
}

// undoToJobkey handles a task that left asynq's waiting states before its
// delete: asynq runs it, or ran it. Its jobkey copy, held, cannot have run,
// and goes.
func (s *shifter) undoToJobkey(ctx context.Context, id, st string) error {
	what := "asynq started it during the move"
	if st != asynq.TaskStateActive.String() {
		what = fmt.Sprintf("asynq ran it during the move (now %s there)", st)
	}
	err := s.q.DeleteIn(ctx, id, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil:
		s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: st, Reason: what + "; its jobkey copy, held, was deleted"})
	case errors.Is(err, jobkey.ErrNotFound) && st == asynq.TaskStateActive.String():
		s.m.note(&s.m.rep.Left, TaskNote{ID: id, State: st, Reason: "running in asynq: left to finish there"})
	case errors.Is(err, jobkey.ErrNotFound):
		s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: st, Reason: what + "; it has no jobkey copy"})
	case errors.As(err, &se):
		// Only a copy enqueued due, by a run older than the migration
		// state, can have been claimed.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: st,
			Reason: fmt.Sprintf("%s, and its jobkey copy is %s: it runs in both", what, se.State)})
	default:
		return fmt.Errorf("asynqcompat: migrate: task %q left asynq's waiting states during its move; remove its held jobkey copy: %w (rerun to finish)", id, err)
	}
	return s.st.forget(ctx, id)
}

// errNotPending says a jobkey job is no longer pending (or its canceled
// run may still be stopping): it stays in jobkey.
type errNotPending struct {
	state   string
	running time.Time
}

func (e *errNotPending) Error() string { return "the jobkey job is " + e.state }

// toAsynq runs a move into asynq from its recorded step. j is the listed
// job for a fresh move (nil for one recovered from the state); now is this
// host's time for the lease check.
func (s *shifter) toAsynq(ctx context.Context, id string, rec *moveRec, j *jobkey.Job, now time.Time) error {
	recovered := j == nil
	if rec.Step == stepHold {
		var cur *jobkey.Job
		var err error
		if !recovered {
			// Hold the job: not claimable while it is copied, and only
			// while it is pending with no run that may still be stopping.
			cur, err = s.q.Update(ctx, id, func(c *jobkey.Job) error {
				switch {
				case c.State != jobkey.StatePending:
					return &errNotPending{state: c.State.String()}
				case c.LeaseUntil.After(now):
					return &errNotPending{state: c.State.String(), running: c.LeaseUntil}
				case c.Type != j.Type || !bytes.Equal(c.Payload, j.Payload):
					return &errNotPending{state: "changed since it was listed"}
				case c.RunAt.Equal(holdUntil):
					// The held copy of a move into jobkey under way, from
					// another asynq queue: that move decides where it runs.
					return errHeldElsewhere
				}
				holdJob(c)
				return nil
			})
			var np *errNotPending
			switch {
			case errors.Is(err, errHeldElsewhere):
				s.m.note(&s.m.rep.Left, TaskNote{ID: id, State: "pending",
					Reason: "held by a migration into jobkey under way (from another asynq queue): left to it; rerun after it to move the job"})
				return s.st.forget(ctx, id)
			case errors.As(err, &np) && !np.running.IsZero():
				s.m.note(&s.m.rep.Left, TaskNote{ID: id, State: np.state,
					Reason: stopping(np.running) + ": left in jobkey, which keeps its ID until then; rerun after that to move it"})
				return s.st.forget(ctx, id)
			case errors.As(err, &np):
				s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: np.state, Reason: left(np.state) + "; it stays there, and nothing was put into asynq"})
				return s.st.forget(ctx, id)
			case errors.Is(err, jobkey.ErrNotFound):
				s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: "gone", Reason: left("gone") + "; nothing was put into asynq"})
				return s.st.forget(ctx, id)
			case errors.Is(err, jobkey.ErrTooLarge):
				s.m.note(&s.m.rep.Skipped, TaskNote{ID: id, State: "pending",
					Reason: fmt.Sprintf("with the hold's mark (Meta %q), the job would be over jobkey's value limit: it stays in jobkey", metaHeldRunAt)})
				return s.st.forget(ctx, id)
			case err != nil:
				return fmt.Errorf("asynqcompat: migrate to asynq: hold job %q in jobkey: %w (rerun to finish the move)", id, err)
			}
			if err := s.at(atBeforeEnqueue, id); err != nil {
				return err
			}
		} else {
			cur, err = s.q.Get(ctx, id)
			switch {
			case errors.Is(err, jobkey.ErrNotFound), err == nil && !held(cur, rec):
				// Never held: nothing was put into asynq.
				return s.st.forget(ctx, id)
			case err != nil:
				return fmt.Errorf("asynqcompat: migrate to asynq: unfinished move of job %q: read it in jobkey: %w", id, err)
			}
		}
		if skipped, err := s.writeCopy(ctx, cur, rec); err != nil || skipped {
			return err
		}
		if err := s.at(atAfterEnqueue, id); err != nil {
			return err
		}
		rec.Step = stepCopied
	}
	if rec.Step == stepCopied {
		err := s.st.releaseHeld(ctx, id, rec.RunAt, stepDelete, func() error {
			if err := s.at(atAfterReread, id); err != nil {
				return err
			}
			// The jobkey job must still be held: one made due (or changed,
			// or deleted) by hand since the hold may run in jobkey, and its
			// asynq copy must then never be made due beside it.
			cur, err := s.q.Get(ctx, id)
			switch {
			case errors.Is(err, jobkey.ErrNotFound):
				return &errJobkeyUnheld{state: "gone"}
			case err != nil:
				return fmt.Errorf("read it in jobkey: %w", err)
			case !held(cur, rec):
				return &errJobkeyUnheld{state: cur.State.String()}
			}
			return s.at(atHeldChecked, id)
		})
		var uh *errJobkeyUnheld
		switch {
		case errors.Is(err, errCopyGone):
			return s.copyGone(ctx, id, rec)
		case errors.As(err, &uh):
			return s.jobkeyUnheld(ctx, id, uh.state)
		case err != nil:
			return fmt.Errorf("asynqcompat: migrate to asynq: job %q: make its asynq copy due: %w (rerun to finish the move)", id, err)
		}
		if err := s.at(atAfterRelease, id); err != nil {
			return err
		}
	}
	// The asynq copy is due: the held jobkey job goes.
	cur, err := s.q.Get(ctx, id)
	switch {
	case errors.Is(err, jobkey.ErrNotFound):
	case err == nil && !held(cur, rec):
		// Made due (or changed) by hand after the check above read it
		// held, before the asynq copy was made due: the check does not
		// WATCH the jobkey job, whose key is outside the asynq queue's
		// cluster slot. Both copies are due: reported, never counted moved.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: cur.State.String(),
			Reason: "its held jobkey job was made due, or changed, by hand in jobkey while the move made its asynq copy due: it is due in both; delete one of them"})
		return s.st.forget(ctx, id)
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q is in asynq; read it in jobkey: %w (rerun to finish the move)", id, err)
	default:
		if err := s.q.DeleteIn(ctx, id, jobkey.StatePending); err != nil && !errors.Is(err, jobkey.ErrNotFound) {
			return fmt.Errorf("asynqcompat: migrate to asynq: job %q is in asynq; delete its held copy from jobkey queue %q: %w (rerun to finish the move)", id, s.q.Name(), err)
		}
	}
	return s.moved(ctx, atAfterDelete, id, recovered)
}

// moved ends a move whose last step is done: the crash point after it,
// then it is counted (AlreadyMoved when a rerun finished it) and its record
// goes. It is counted first: the task is in the target whether or not the
// record's removal then fails (a rerun finding the record counts it again,
// in AlreadyMoved).
func (s *shifter) moved(ctx context.Context, point, id string, recovered bool) error {
	if err := s.at(point, id); err != nil {
		return err
	}
	if recovered {
		s.m.count(&s.m.rep.AlreadyMoved)
	} else {
		s.m.count(&s.m.rep.Moved)
	}
	return s.st.forget(ctx, id)
}

// asynqCounts returns the Retried and MaxRetry of the asynq copy of a
// pending jobkey job: the retries spent before it came into jobkey
// (Meta[MetaRetried]) plus the runs jobkey made of it, and a MaxRetry that
// leaves the copy the runs jobkey would still give it (MaxAttempts -
// Attempt, at least one). A task so gets the same number of runs in all,
// whichever system holds it.
func asynqCounts(j *jobkey.Job) (retried, maxRetry int) {
	retried = min(retriedBefore(j)+max(j.Attempt, 0), math.MaxInt32)
	return retried, min(max(MaxRetry(j), retried), math.MaxInt32)
}

// writeCopy writes the asynq copy of a held jobkey job, scheduled at
// holdUntil, and records step "copied" in the same transaction. A task of
// another type or payload under the ID skips the job: it is made due
// again in jobkey.
func (s *shifter) writeCopy(ctx context.Context, j *jobkey.Job, rec *moveRec) (skipped bool, err error) {
	// The copy's Retried counts the retries spent in both systems, and its
	// MaxRetry leaves it the runs jobkey would have.
	retried, maxRetry := asynqCounts(j)
	m := &asynqMsg{Type: j.Type, Payload: j.Payload, ID: j.ID, Queue: s.st.queue, Retry: maxRetry, Retried: retried,
		ErrorMsg: j.LastError, LastFailedAt: rec.LastFailedAt, Timeout: int64(asynqDefaultTimeout / time.Second)}
	if j.Timeout > 0 {
		// asynq keeps whole seconds: round up, so that the timeout is never
		// shorter, nor 0 (asynq's default).
		m.Timeout = int64((j.Timeout + time.Second - 1) / time.Second)
	}
	if j.Retention > 0 {
		// Rounded up, as the Timeout: never kept shorter.
		m.Retention = int64((j.Retention + time.Second - 1) / time.Second)
	}
	if !j.Deadline.IsZero() {
		m.Deadline = j.Deadline.Unix() // whole seconds, as asynq's Client keeps it
		if j.Timeout == 0 {
			m.Timeout = 0 // asynq's Client gives a task with a Deadline no default timeout
		}
	}
	err = s.st.writeHeld(ctx, j.ID, m, stepCopied)
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, errIDTaken):
		return false, fmt.Errorf("asynqcompat: migrate to asynq: write the asynq copy of job %q: %w (rerun to finish the move)", j.ID, err)
	}
	_, err = s.q.Update(ctx, j.ID, func(c *jobkey.Job) error {
		if !held(c, rec) {
			return errNotHeld
		}
		unholdJob(c, rec.RunAt)
		return nil
	})
	if err != nil && !errors.Is(err, errNotHeld) {
		return false, fmt.Errorf("asynqcompat: migrate to asynq: job %q stays in jobkey (asynq holds another task under its ID); make it due again: %w (rerun to finish)", j.ID, err)
	}
	s.m.note(&s.m.rep.Skipped, TaskNote{ID: j.ID, State: "pending",
		Reason: fmt.Sprintf("asynq queue %q holds another task under this ID", s.st.queue)})
	return true, s.st.forget(ctx, j.ID)
}

// copyGone ends a move into asynq whose held asynq copy is gone before
// its release: someone ran it by hand (asynq's "task run",
// Inspector.RunTask) and asynq is done with it, or deleted it. It is not
// written again, and the held jobkey job, which nothing could claim, is
// deleted: the task ran once, in asynq, or was deleted as its operator
// asked.
func (s *shifter) copyGone(ctx context.Context, id string, rec *moveRec) error {
	const what = "its asynq copy, held, was run by hand (or deleted) in asynq before the move made it due, and asynq is done with it"
	err := s.q.DeleteIn(ctx, id, jobkey.StatePending)
	var se *jobkey.StateError
	switch {
	case err == nil:
		s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: "gone", Reason: what + "; it is not put into asynq again, and its held jobkey job was deleted"})
	case errors.Is(err, jobkey.ErrNotFound):
		s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: "gone", Reason: what + "; it is not put into asynq again"})
	case errors.As(err, &se):
		// The held job is claimable only if someone changed it by hand.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: "gone",
			Reason: fmt.Sprintf("%s, and its jobkey job, no longer held, is %s: it runs in both", what, se.State)})
	default:
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q: %s; delete its held jobkey job: %w (rerun to finish)", id, what, err)
	}
	return s.st.forget(ctx, id)
}

// errJobkeyUnheld says the held jobkey job of a move into asynq is no
// longer held when its asynq copy is to be made due: someone changed it
// by hand (Queue.Update of its RunAt), or deleted it. state is the job's
// state, or "gone".
type errJobkeyUnheld struct{ state string }

func (e *errJobkeyUnheld) Error() string {
	return "the held jobkey job is no longer held (" + e.state + ")"
}

// jobkeyUnheld ends a move into asynq whose held jobkey job was made due,
// changed or deleted by hand before the asynq copy was made due: the job
// stays in jobkey (or stays deleted), and the asynq copy, still held and so
// never run, is deleted with the move's record in one transaction.
func (s *shifter) jobkeyUnheld(ctx context.Context, id, state string) error {
	const what = "its held jobkey job was made due, changed or deleted by hand in jobkey before the move made its asynq copy due"
	dropped, err := s.st.dropHeldCopy(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("asynqcompat: migrate to asynq: job %q: %s; delete its held asynq copy: %w (rerun to finish)", id, what, err)
	case dropped:
		s.m.note(&s.m.rep.Undone, TaskNote{ID: id, State: state, Reason: what + "; it stays in jobkey, and its held asynq copy was deleted"})
	default:
		// The asynq copy was run by hand too.
		s.m.note(&s.m.rep.Twice, TaskNote{ID: id, State: state,
			Reason: what + ", and its asynq copy, no longer held, was run by hand in asynq: it runs in both"})
	}
	return nil
}
