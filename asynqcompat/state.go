package asynqcompat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A migration's own state lives in one Redis value per asynq queue: which
// tasks it is moving, at which step, and whether it paused the queue. It is
// written by WATCH/MULTI/EXEC only, and its key carries the asynq queue's
// hash tag ("{queue}") so that the transactions that delete or release the
// asynq side of a move, or pause the queue, record their step in the same
// EXEC (they share a cluster slot with asynq's keys of the queue). A rerun
// reads it first and finishes every move it lists (recover).
//
// Neither copy of a task can run in both systems because the copy in the
// target is held, not runnable, until the source is gone:
//
//   - into jobkey: record the move (step "enqueue"); enqueue the jobkey
//     copy with RunAt = holdUntil; in one transaction, under WATCH of the
//     asynq task, delete the task from asynq only while it still waits
//     there and record step "release"; then set the jobkey copy's RunAt to
//     the task's own, and forget the move. A task asynq took or ran before
//     that transaction keeps running there, and its held jobkey copy, which
//     nothing can claim, is deleted.
//   - into asynq: record the move (step "hold"); hold the jobkey job (RunAt
//     = holdUntil, by Queue.Update, only while it is pending with no run in
//     force); in one transaction, write the asynq copy scheduled at
//     holdUntil and record step "copied"; in one transaction, under WATCH
//     of that copy, make it due and record step "delete", only while the
//     jobkey job is still held (one made due or deleted by hand stays in
//     jobkey, and the held copy is deleted instead; that read is not a
//     WATCH, the job's key being outside the queue's slot, so one made due
//     by hand between it and the EXEC is found after, and reported in
//     Twice, never counted moved); then delete the
//     held jobkey job, and forget the move. A job jobkey claimed before the
//     hold stays in jobkey, and nothing was put into asynq. The asynq copy
//     exists exactly from step "copied" on: one found gone at its release
//     was run by hand (asynq's "task run", Inspector.RunTask) and is done,
//     or was deleted, and is never written again; its held jobkey job goes.
//
// A crash between any two steps leaves the move recorded at a step that
// says which copies exist and which may run, and recover goes on from it.
//
// The writes to jobkey (the enqueue of a held copy, the hold) are not
// fenced by the lock: a run paused past its lock may make one after a
// rerun forgot its move. Such a copy is recorded nowhere; a run holding
// the lock and the jobkey queue's claim takes it as abandoned (shifter's
// adoptHeld and releaseAbandonedHold), recognized by its marks in Meta.

// holdUntil is the run time of a held copy: never due. A rerun recognizes
// a held copy by it (and by the recorded move, or the marks in its Meta).
var holdUntil = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// The directions and steps of a recorded move.
const (
	dirToJobkey = "to-jobkey"
	dirToAsynq  = "to-asynq"

	stepEnqueue = "enqueue" // to jobkey: a held jobkey copy may exist; the asynq task is untouched
	stepRelease = "release" // to jobkey: the asynq task is deleted; the held jobkey copy is to be made due
	stepHold    = "hold"    // to asynq: the jobkey job may be held; no asynq copy was written
	stepCopied  = "copied"  // to asynq: the jobkey job is held, and so is the asynq copy written with this step
	stepDelete  = "delete"  // to asynq: the asynq copy is due; the held jobkey job is to be deleted
)

// migState is the value of a migration state key.
type migState struct {
	// Paused says that a migration paused the asynq queue (and an operator
	// had not): the run that finds it set resumes the queue when done.
	Paused bool `json:"paused,omitempty"`
	// PauseMark is the value the migration wrote to asynq's paused key: a
	// Unix time in nanoseconds, where asynq's PauseQueue writes seconds
	// (asynq only tests the key's existence). A paused key with another
	// value is an operator's pause made since (unpaused and paused again),
	// and is never resumed. Empty in states written before it existed.
	PauseMark string `json:"pause_mark,omitempty"`
	// Moves are the moves under way, by task ID.
	Moves map[string]*moveRec `json:"moves,omitempty"`
}

// moveRec is one move under way.
type moveRec struct {
	Dir         string    `json:"dir"`
	Step        string    `json:"step"`
	JobkeyQueue string    `json:"jobkey_queue"`
	Type        string    `json:"type"`
	RunAt       time.Time `json:"run_at"` // when the target copy is due once released
	// LastErr, into jobkey, is the asynq task's last error, for the jobkey
	// copy's LastError.
	LastErr string `json:"last_err,omitempty"`
	// LastFailedAt, into asynq, is when the jobkey job was last written
	// with its LastError (Unix seconds), for the asynq copy's LastFailedAt.
	// Into jobkey, it is the asynq task's LastFailedAt as listed.
	LastFailedAt int64 `json:"last_failed_at,omitempty"`
	// Retried, into jobkey, is the asynq task's retry count as listed.
	Retried int `json:"retried,omitempty"`
}

// listed says whether m, an asynq task's message, is the task a move into
// jobkey listed and made its held copy from. asynq's retry of a failed run
// writes the retry count (unless the error is not a failure), the last
// error and the failure time: a task asynq ran and retried since differs
// in one of them, and its held copy would give it the runs it has spent
// again. A move recorded before Retried existed reads 0 there: a task with
// retries then differs, and is listed again, which is safe.
func (r *moveRec) listed(m *asynqMsg) bool {
	return r.Retried == m.Retried && r.LastFailedAt == m.LastFailedAt && r.LastErr == cutError(m.ErrorMsg)
}

// stateKey is the Redis key of the migration state of an asynq queue: in
// the queue's hash tag, outside asynq's "asynq:" keys (which asynq may
// delete with the queue).
func stateKey(queue string) string { return "asynqcompat:{" + queue + "}:migration" }

// The asynq keys a migration writes in its own transactions (asynq's
// internal/base layout, v0.26).
func asynqTaskKey(queue, id string) string    { return "asynq:{" + queue + "}:t:" + id }
func asynqListKey(queue, state string) string { return "asynq:{" + queue + "}:" + state }
func asynqPausedKey(queue string) string      { return "asynq:{" + queue + "}:paused" }

// ErrStateUnreadable is what a migration returns when its state value
// cannot be decoded: it is kept as it is, and the run writes nothing.
var ErrStateUnreadable = errors.New("asynqcompat: the migration state cannot be read")

// stateStore reads and writes one asynq queue's migration state, fenced by
// the run's migration lock: every write checks, in the same WATCH, that the
// lock still holds this run's token.
type stateStore struct {
	rdb   redis.UniversalClient
	queue string
	lock  *queueLock
	dur   durability // what each write waits for

	// mu serializes this run's own writes: its moves all write the one
	// value, and would otherwise mostly fail each other's EXEC. WATCH still
	// guards against any other writer.
	mu sync.Mutex
}

func decodeState(queue string, raw string, err error) (*migState, error) {
	st := &migState{}
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return nil, fmt.Errorf("asynqcompat: read the migration state of asynq queue %q: %w", queue, err)
	default:
		if err := json.Unmarshal([]byte(raw), st); err != nil {
			return nil, fmt.Errorf("%w: key %q: %v (kept as it is)", ErrStateUnreadable, stateKey(queue), err)
		}
	}
	for id, rec := range st.Moves {
		if why := rec.invalid(); why != "" {
			return nil, fmt.Errorf("%w: key %q: move of task %q: %s (kept as it is)", ErrStateUnreadable, stateKey(queue), id, why)
		}
	}
	if st.Moves == nil {
		st.Moves = map[string]*moveRec{}
	}
	return st, nil
}

// invalid says why a decoded move is not one a run wrote, or "": a run
// acts on a move by its direction and step, and a step it does not know
// must not be taken for one it does.
func (r *moveRec) invalid() string {
	switch {
	case r == nil:
		return "the move is null"
	case r.Dir == dirToJobkey && (r.Step == stepEnqueue || r.Step == stepRelease):
	case r.Dir == dirToAsynq && (r.Step == stepHold || r.Step == stepCopied || r.Step == stepDelete):
	default:
		return fmt.Sprintf("direction %q with step %q", r.Dir, r.Step)
	}
	if r.JobkeyQueue == "" || r.Type == "" {
		return "no jobkey queue or type"
	}
	return ""
}

// read returns the state as stored now.
func (s *stateStore) read(ctx context.Context) (*migState, error) {
	raw, err := s.rdb.Get(ctx, stateKey(s.queue)).Result()
	return decodeState(s.queue, raw, err)
}

// update runs fn on the state as stored now, with watch (keys of the same
// slot) watched too, and writes the state fn leaves, with the writes fn
// returns (command arguments), in one MULTI/EXEC, which waits for the
// replicas (durability.exec; what names the write in its error). fn may
// read through tx; an error from fn writes nothing, and so does a state
// left as it was with no writes. A change to any watched key between the
// read and the EXEC reruns fn on the newer values.
func (s *stateStore) update(ctx context.Context, what writeLabel, watch []string, fn func(tx *redis.Tx, st *migState) ([][]any, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := stateKey(s.queue)
	keys := append([]string{s.lock.key, key}, watch...)
	what.queue = s.queue
	for i := range 50 {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			tok, err := tx.Get(ctx, s.lock.key).Result()
			if errors.Is(err, redis.Nil) || (err == nil && tok != s.lock.token) {
				return fmt.Errorf("%w: asynq queue %q: key %q no longer holds this run's token", ErrLockLost, s.queue, s.lock.key)
			}
			if err != nil {
				return err
			}
			raw, err := tx.Get(ctx, key).Result()
			stored := err == nil
			st, err := decodeState(s.queue, raw, err)
			if err != nil {
				return err
			}
			writes, err := fn(tx, st)
			if err != nil {
				return err
			}
			val, err := json.Marshal(st)
			if err != nil {
				return err
			}
			empty := len(st.Moves) == 0 && !st.Paused
			if len(writes) == 0 && (empty && !stored || !empty && raw == string(val)) {
				return nil // nothing to write, nor to wait for
			}
			state := []any{"set", key, val}
			if empty {
				state = []any{"del", key}
			}
			return s.dur.exec(ctx, tx, key, what, append([][]any{state}, writes...))
		}, keys...)
		if errors.Is(err, redis.TxFailedErr) {
			// A watched key changed (asynq's server, the lock's renewal):
			// read again, after a short pause once it keeps happening.
			if i > 5 {
				time.Sleep(time.Duration(i) * time.Millisecond)
			}
			continue
		}
		return err
	}
	return fmt.Errorf("asynqcompat: migration state of asynq queue %q: too many concurrent changes", s.queue)
}

// begin records a move at its first step. A move already recorded for the
// ID is an error: recover finishes those before a run moves anything.
func (s *stateStore) begin(ctx context.Context, id string, rec moveRec) error {
	return s.update(ctx, writeLabel{task: id, write: "record the move"}, nil, func(_ *redis.Tx, st *migState) ([][]any, error) {
		if cur, ok := st.Moves[id]; ok {
			return nil, fmt.Errorf("asynqcompat: task %q has an unfinished move (%s, step %s) in the migration state of asynq queue %q; rerun to finish it", id, cur.Dir, cur.Step, s.queue)
		}
		st.Moves[id] = &rec
		return nil, nil
	})
}

// forget removes a finished (or abandoned) move from the state.
func (s *stateStore) forget(ctx context.Context, id string) error {
	return s.update(ctx, writeLabel{task: id, write: "forget the ended move"}, nil, func(_ *redis.Tx, st *migState) ([][]any, error) {
		delete(st.Moves, id)
		return nil, nil
	})
}

// errNotWaiting is what deleteWaiting returns when the asynq task no longer
// waits: state is asynq's state name, or "gone".
type errNotWaiting struct{ state string }

func (e *errNotWaiting) Error() string { return "the asynq task is " + e.state }

// errUniqueHeld is what deleteWaiting returns when the asynq task holds its
// unique lock: it stays in asynq.
type errUniqueHeld struct{ key string }

func (e *errUniqueHeld) Error() string { return "the asynq task holds its unique lock " + e.key }

// errTaskChanged is what deleteWaiting returns when the asynq task still
// waits, but is no longer the task its move listed and made its held copy
// from: asynq ran it since, and it failed and waits to be retried (asynq's
// retry writes its retry count, last error and failure time).
var errTaskChanged = errors.New("the asynq task ran again since its move listed it")

// errTaskUnreadable is what deleteWaiting returns when the asynq task's
// message cannot be decoded: it stays in asynq as it is.
type errTaskUnreadable struct{ err error }

func (e *errTaskUnreadable) Error() string { return e.err.Error() }

// deleteWaiting deletes an asynq task only while it waits (pending,
// scheduled or retry), holds no unique lock (asynq.Unique) and is the task
// its move listed (moveRec.listed), and records the move's next step, in
// one transaction under WATCH of the task. checked, if set, runs after the
// task is read and before the EXEC.
func (s *stateStore) deleteWaiting(ctx context.Context, id, next string, checked func() error) error {
	tk := asynqTaskKey(s.queue, id)
	return s.update(ctx, writeLabel{task: id, write: "delete the waiting asynq task"}, []string{tk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		vals, err := tx.HMGet(ctx, tk, "state", "unique_key", "msg").Result()
		if err != nil {
			return nil, err
		}
		state, _ := vals[0].(string)
		unique, _ := vals[1].(string)
		msg, _ := vals[2].(string)
		if state == "" {
			state = "gone"
		}
		if !waiting(state) {
			return nil, &errNotWaiting{state}
		}
		var uniqueHeld bool
		if unique != "" {
			cur, err := tx.Get(ctx, unique).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			uniqueHeld = cur == id
		}
		if uniqueHeld {
			// Deleting the task would release its lock, and asynq would
			// take a duplicate: jobkey has no uniqueness to hand it to.
			return nil, &errUniqueHeld{key: unique}
		}
		rec := st.Moves[id]
		if rec != nil {
			m, err := decodeMsg([]byte(msg))
			if err != nil {
				return nil, &errTaskUnreadable{err}
			}
			if !rec.listed(m) {
				return nil, errTaskChanged
			}
		}
		if checked != nil {
			if err := checked(); err != nil {
				return nil, err
			}
		}
		if rec != nil {
			rec.Step = next
		}
		list := []any{"zrem", asynqListKey(s.queue, state), id}
		if state == "pending" {
			list = []any{"lrem", asynqListKey(s.queue, state), 0, id}
		}
		return [][]any{list, {"del", tk}}, nil
	})
}

// errIDTaken is what writeHeld returns when asynq holds another task
// under the ID.
var errIDTaken = errors.New("asynq holds another task under this ID")

// writeHeld writes the asynq copy msg of a move into asynq, scheduled at
// holdUntil, as asynq's Client would enqueue it, and records the move's
// next step, in one transaction under WATCH of the task key. A task there
// already with the same type and payload is taken for this move's copy: a
// held one (an older run's, enqueued by asynq's Client) gets msg, one not
// held is left as it is and the release below finds it due. Another task
// under the ID is errIDTaken, and nothing is written.
func (s *stateStore) writeHeld(ctx context.Context, id string, m *asynqMsg, next string) error {
	tk := asynqTaskKey(s.queue, id)
	sched := asynqListKey(s.queue, "scheduled")
	msg := m.encode()
	// asynq's Client lists the queue in asynq:queues (its own key, outside
	// the queue's slot) before it writes a task, and so does this.
	err := s.dur.write(ctx, s.rdb, "asynq:queues", writeLabel{queue: s.queue, task: id, write: "list the asynq queue in asynq:queues"},
		[][]any{{"sadd", "asynq:queues", s.queue}})
	if err != nil {
		return fmt.Errorf("asynqcompat: list asynq queue %q in asynq:queues: %w", s.queue, err)
	}
	return s.update(ctx, writeLabel{task: id, write: "write the held asynq copy"}, []string{tk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		raw, err := tx.HGet(ctx, tk, "msg").Bytes()
		exists := err == nil
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		held := false
		if exists {
			typ, payload, derr := msgTypePayload(raw)
			if derr != nil || typ != m.Type || !bytes.Equal(payload, m.Payload) {
				return nil, errIDTaken
			}
			score, err := tx.ZScore(ctx, sched, id).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			held = err == nil && int64(score) >= holdUntil.Unix()
		}
		if rec := st.Moves[id]; rec != nil {
			rec.Step = next
		}
		if exists && !held {
			return nil, nil
		}
		if held {
			return [][]any{{"hset", tk, "msg", msg}}, nil
		}
		return [][]any{
			{"hset", tk, "msg", msg, "state", "scheduled"},
			{"zadd", sched, holdUntil.Unix(), id},
		}, nil
	})
}

// errCopyGone is what releaseHeld returns when the asynq copy is gone
// before its release: run by hand and done, or deleted.
var errCopyGone = errors.New("the asynq copy is gone before its release")

// releaseHeld makes a held asynq copy (scheduled at holdUntil) due at
// runAt, and records the move's next step, in one transaction. A copy not
// held (run by hand, or an older run's copy enqueued due) is left as it
// is; a copy gone is errCopyGone, and nothing is written. checked, if set,
// runs before the EXEC.
func (s *stateStore) releaseHeld(ctx context.Context, id string, runAt time.Time, next string, checked func() error) error {
	tk := asynqTaskKey(s.queue, id)
	sched := asynqListKey(s.queue, "scheduled")
	// The task key, not the busy scheduled set: a held copy's score is
	// changed by nobody else, and its removal changes the task key too.
	return s.update(ctx, writeLabel{task: id, write: "make the held asynq copy due"}, []string{tk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		state, err := tx.HGet(ctx, tk, "state").Result()
		if errors.Is(err, redis.Nil) {
			return nil, errCopyGone
		}
		if err != nil {
			return nil, err
		}
		held := false
		if state == "scheduled" {
			score, err := tx.ZScore(ctx, sched, id).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			held = err == nil && int64(score) >= holdUntil.Unix()
		}
		if checked != nil {
			if err := checked(); err != nil {
				return nil, err
			}
		}
		if rec := st.Moves[id]; rec != nil {
			rec.Step = next
		}
		if !held {
			return nil, nil
		}
		if runAt.After(time.Now()) {
			return [][]any{{"zadd", sched, runAt.Unix(), id}}, nil
		}
		// Due now: put it where asynq's enqueue would have.
		return [][]any{
			{"zrem", sched, id},
			{"hset", tk, "state", "pending", "pending_since", strconv.FormatInt(time.Now().UnixNano(), 10)},
			{"lpush", asynqListKey(s.queue, "pending"), id},
		}, nil
	})
}

// pause pauses the asynq queue, as asynq's Inspector.PauseQueue does, and
// records that this migration paused it, in one transaction. A queue
// paused already is left as it is: by an operator (the state does not say
// a migration paused it), it is never resumed by a migration; by a crashed
// migration, it stays paused and is resumed by this run.
func (s *stateStore) pause(ctx context.Context) error {
	pk := asynqPausedKey(s.queue)
	return s.update(ctx, writeLabel{write: "pause the asynq queue"}, []string{pk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		n, err := tx.Exists(ctx, pk).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			// Paused already: by an operator (kept), or by a stopped
			// migration (st.Paused, resumed by this run).
			return nil, nil
		}
		st.Paused = true
		st.PauseMark = strconv.FormatInt(time.Now().UnixNano(), 10)
		return [][]any{{"set", pk, st.PauseMark}}, nil
	})
}

// resume unpauses the asynq queue if a migration paused it, and records
// that, in one transaction. A pause an operator made since (the paused key
// no longer holds the migration's mark) stays. It returns whether it
// unpaused the queue.
func (s *stateStore) resume(ctx context.Context) (bool, error) {
	pk := asynqPausedKey(s.queue)
	did := false
	err := s.update(ctx, writeLabel{write: "resume the asynq queue"}, []string{pk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		did = false
		if !st.Paused {
			return nil, nil
		}
		cur, err := tx.Get(ctx, pk).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		did = err == nil && (st.PauseMark == "" || cur == st.PauseMark)
		st.Paused, st.PauseMark = false, ""
		if !did {
			return nil, nil
		}
		return [][]any{{"del", pk}}, nil
	})
	return did, err
}

// dropHeldCopy deletes the held asynq copy of a move into asynq (one still
// scheduled at holdUntil) and forgets the move, in one transaction under
// WATCH of the copy. A copy no longer held (run by hand) is left as it is,
// and the move is forgotten all the same. It says whether it deleted it.
func (s *stateStore) dropHeldCopy(ctx context.Context, id string) (bool, error) {
	tk := asynqTaskKey(s.queue, id)
	sched := asynqListKey(s.queue, "scheduled")
	dropped := false
	err := s.update(ctx, writeLabel{task: id, write: "delete the held asynq copy"}, []string{tk}, func(tx *redis.Tx, st *migState) ([][]any, error) {
		dropped = false
		state, err := tx.HGet(ctx, tk, "state").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if state == "scheduled" {
			score, err := tx.ZScore(ctx, sched, id).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			dropped = err == nil && int64(score) >= holdUntil.Unix()
		}
		delete(st.Moves, id)
		if !dropped {
			return nil, nil
		}
		return [][]any{{"zrem", sched, id}, {"del", tk}}, nil
	})
	return dropped, err
}
