package jobkey

import (
	"fmt"
	"maps"
	"strings"
	"time"
)

// State is where a job stands. Its wire values are explicit and stable:
// they are stored in Redis and must never be renumbered.
type State uint8

// The states of a job. Zero is deliberately not a state, so a value that
// lost its state field cannot pass for a pending job.
const (
	StatePending   State = 1 // waiting for RunAt, then claimable
	StateActive    State = 2 // claimed by a worker under a lease
	StateSucceeded State = 3 // finished with a result
	StateFailed    State = 4 // attempts exhausted or failed for good
	StateCanceled  State = 5 // canceled before finishing
)

// String returns the state's lower-case name.
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateActive:
		return "active"
	case StateSucceeded:
		return "succeeded"
	case StateFailed:
		return "failed"
	case StateCanceled:
		return "canceled"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool { return s >= StatePending && s <= StateCanceled }

// Finished reports whether s is a terminal state.
func (s State) Finished() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCanceled
}

// Job is a job and everything about where it stands. It is stored as one
// value under one Redis key and only ever written whole.
type Job struct {
	ID          string    // unique within the queue
	Queue       string    // the queue's name
	Type        string    // what kind of work; selects the handler
	Payload     []byte    // the caller's arguments, opaque to jobkey
	State       State     // where the job stands
	Attempt     int       // claims so far; 0 until first claimed
	MaxAttempts int       // claims allowed before the job fails for good
	RunAt       time.Time // earliest time the job may be claimed
	LeaseOwner  string    // worker holding the lease while active
	LeaseUntil  time.Time // lease deadline while active
	LastError   string    // the last failure, if any
	Result      []byte    // what the handler returned on success
	CreatedAt   time.Time // when it was enqueued
	UpdatedAt   time.Time // when it was last written
	Rev         uint64    // revision, bumped by every write
	// LeaseToken is drawn at random by every claim and kept until the next
	// one. Extend, Complete, Fail and Release write only while the stored
	// job is active with the caller's token (fencing), so a worker whose
	// lease ran out can never write over the claim that followed, even when
	// both claims had the same Attempt and LeaseOwner. It is unique to one
	// claim but not ordered; 0 means never claimed by this format.
	LeaseToken uint64
	// Meta is small string metadata carried with the job, set by
	// EnqueueOpts.Meta or Update and kept by every transition: the W3C trace
	// context (traceparent, tracestate) that the otel package injects, say.
	// jobkey does not interpret it. At most MaxMetaEntries entries, with
	// non-empty keys, and MaxMetaBytes of keys and values together (format
	// 1.2; a value written before decodes with a nil Meta). An empty Meta is
	// read back as nil.
	Meta map[string]string
	// Timeout bounds each run of the job: Work ends the handler's context
	// (context.Cause is ErrTimeout) once it has run this long, and a
	// handler that returns an error then fails the attempt with a cause
	// that says "timeout"; the job is retried under the normal backoff.
	// Zero means none, or WorkOpts.Timeout. It is stored with the job, so
	// whichever worker claims it applies it (format 1.3; a value written
	// before decodes with none). Whole milliseconds, at most MaxTimeout.
	Timeout time.Duration
	// Priority orders the due jobs of a shard: a claim takes a job of a
	// higher priority before any of a lower one, and within a priority the
	// oldest RunAt first. 0 (the default) to MaxPriority. Strict: while
	// higher priorities keep jobs due, lower ones wait (format 1.4; a value
	// written before decodes with priority 0).
	Priority int
	// ConcurrencyKey groups jobs under a limit: at most the key's
	// concurrency limit of the queue's jobs with one key are active at
	// once, across every worker and process (Queue.SetConcurrencyLimit,
	// Config.ConcurrencyLimit). Empty means no limit. It is set at enqueue
	// and never changes (format 1.5; a value written before decodes with
	// none). At most MaxConcurrencyKeyLen bytes.
	ConcurrencyKey string
	// Retention is how long the job's key is kept once it has succeeded
	// or been canceled, in place of Config.Retention; zero means the
	// queue's. Its listing entries go with its key (Trim), and, as for any
	// job, the key lives at least until its last run's lease ends
	// (lastrun.go). A failed job keeps Config.FailedRetention, as asynq
	// keeps an archived task whatever its Retention (format 1.6; a value
	// written before decodes with zero). Whole milliseconds, 1s to
	// MaxRetention.
	Retention time.Duration
	// Deadline is an absolute time after which no run of the job may go on:
	// Work ends the handler's context at Deadline, or at the run's Timeout
	// if that comes first (context.Cause is ErrDeadline, ctx.Err() is
	// context.DeadlineExceeded), and the attempt fails and is retried under
	// the normal backoff while attempts remain, as asynq's Deadline does. A
	// job claimed once its Deadline has passed is not run: the attempt
	// fails at once with ErrDeadline, as asynq fails a task whose context
	// is already done. It is judged by Redis's clock. Zero means none
	// (format 1.6; a value written before decodes with none). Whole
	// milliseconds, within 1970..9999.
	Deadline time.Time
	// Snoozes counts the runs that ended in a snooze (Snooze, or a
	// RetryPolicy's RetryDecision.Snooze): each gave its attempt back and
	// set RunAt later. Past Config.MaxSnoozes the next snooze fails the job
	// for good with ErrSnoozeLimit, so a job cannot snooze for ever
	// unnoticed. Queue.Retry resets it (format 1.7; a value written before
	// decodes with 0).
	Snoozes int
	// StartedAt is when the latest claim took the job, by Redis's clock:
	// the start of the run that Attempt counts (format 1.7; zero before
	// the first claim, or in a value claimed before 1.7).
	StartedAt time.Time
	// History is the job's runs, oldest first: how each one ended, when it
	// started, how long it ran, the worker, and its error (history.go). At
	// most MaxHistoryEntries records and MaxHistoryBytes of their text are
	// kept; older ones are dropped first and counted in HistoryDropped
	// (format 1.7; a value written before decodes with none).
	History []AttemptRecord
	// HistoryDropped counts the records dropped from History to keep it
	// within its bounds (format 1.7).
	HistoryDropped int
	// Progress is what the handler reported last with SetProgress: a small
	// value of the caller's own encoding, at most MaxProgressBytes. It
	// rides the run's next lease renewal and its outcome, and stays with
	// the job until a later run reports again (format 1.7; a value written
	// before decodes with none).
	Progress []byte
	// Batch is the ID of the batch the job belongs to (EnqueueBatch,
	// EnqueueChain): its final outcome is counted in the batch's value in
	// the EXEC that writes it, and the last one enqueues the batch's
	// callback there too (batch.go). Empty means none. It is set at
	// enqueue and never changes (format 1.8; a value written before
	// decodes with none).
	Batch string

	// future holds the fields a newer minor version appended, as read, so
	// that writing the job back keeps them: an older worker's claim or
	// completion never drops what a newer producer wrote (docs/design.md,
	// section 10).
	future futureFields
}

// futureFields are fields this build does not know, kept raw.
type futureFields struct {
	minor uint64 // the minor version that wrote them
	n     int    // how many
	raw   []byte // their encoding; never modified
}

// minorAs is the minor version to write for a build that knows the first
// known fields: that build's, or the newer one whose fields the job
// carries (tests use it to play an older build: see decodeJobAs).
func (j *Job) minorAs(known int) uint64 { return max(minorOf(known), j.future.minor) }

// Limits of Job.Meta, checked by Enqueue, EnqueueMany, Update, Marshal and
// Unmarshal alike.
const (
	MaxMetaEntries = 64   // entries in Job.Meta
	MaxMetaBytes   = 4096 // bytes of Job.Meta's keys and values together
)

// MaxRetention bounds a job's own Retention (Job.Retention).
const MaxRetention = 10 * 365 * 24 * time.Hour

// validRetention refuses a Retention the value format does not hold, or
// one under the second Config.Retention needs at least, with ErrInvalid,
// and rounds a fraction of a millisecond up. Zero is the queue's.
func validRetention(d time.Duration) (time.Duration, error) {
	if d != 0 && (d < time.Second || d > MaxRetention) {
		return 0, fmt.Errorf("%w: Retention is %v, want 0 (the queue's) or 1s..%v", ErrInvalid, d, MaxRetention)
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond), nil
}

// validDeadline refuses a Deadline a value cannot hold in milliseconds,
// with ErrInvalid, and keeps it to the millisecond, in UTC. Zero is none.
func validDeadline(t time.Time) (time.Time, error) {
	if t.IsZero() {
		return time.Time{}, nil
	}
	if err := validTime("Deadline", t); err != nil {
		return time.Time{}, err
	}
	t = t.UTC().Truncate(time.Millisecond)
	if t.UnixMilli() == 0 {
		// 0 is how a value says "none".
		return time.Time{}, fmt.Errorf("%w: Deadline %v is the Unix epoch, which a value stores as no deadline", ErrInvalid, t)
	}
	return t, nil
}

// MaxPriority is the highest Job.Priority.
const MaxPriority = 9

// validPriority refuses a Priority outside 0..MaxPriority, with ErrInvalid.
func validPriority(p int) error {
	if p < 0 || p > MaxPriority {
		return fmt.Errorf("%w: Priority is %d, want 0..%d", ErrInvalid, p, MaxPriority)
	}
	return nil
}

// validTimeout refuses a Timeout the value format does not hold, with
// ErrInvalid, and rounds a fraction of a millisecond up.
func validTimeout(d time.Duration) (time.Duration, error) {
	if d < 0 || d > MaxTimeout {
		return 0, fmt.Errorf("%w: Timeout is %v, want 0..%v", ErrInvalid, d, MaxTimeout)
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond), nil
}

// validMeta refuses a Meta the value format does not hold, with ErrInvalid.
func validMeta(m map[string]string) error {
	if len(m) > MaxMetaEntries {
		return fmt.Errorf("%w: Meta has %d entries, limit %d", ErrInvalid, len(m), MaxMetaEntries)
	}
	n := 0
	for k, v := range m {
		if k == "" {
			return fmt.Errorf("%w: Meta has an empty key", ErrInvalid)
		}
		n += len(k) + len(v)
	}
	if n > MaxMetaBytes {
		return fmt.Errorf("%w: Meta holds %d bytes of keys and values, limit %d", ErrInvalid, n, MaxMetaBytes)
	}
	return nil
}

// cloneMeta copies m, so a caller's map and a job's never alias; an empty
// map becomes nil, as a decode would give it.
func cloneMeta(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// cloneJob is a shallow copy of j: what a transition writes is a new Job,
// never the stored one edited in place. Each use needs its copy:
//   - decideFenced, decideClaim, claimed, blocked and bulk's transitions
//     build next from cur, and the same decision still reads cur after:
//     its old index entry (move), its slot lease (slotBook), the job a
//     LeaseLostError reports;
//   - worker.call gives the handler its own Job, so what it edits never
//     reaches the fencing fields the worker's renewal and completion use;
//   - enqueue's JobExistsError gives the caller of a repeated ID its own
//     copy of the Job the first caller gets.
//
// None keeps a copy across attempts: decide runs on each attempt's fresh
// read (casTxn), so a Job handed to a caller is never edited by a retry.
func cloneJob(j *Job) *Job {
	c := *j
	return &c
}

// validTime refuses a time a job value cannot hold in milliseconds: before
// 1970 or after 9999.
func validTime(field string, t time.Time) error {
	if y := t.Year(); y < 1970 || y > 9999 {
		return fmt.Errorf("%w: %s %v is outside 1970..9999", ErrInvalid, field, t)
	}
	return nil
}

// MaxConcurrencyKeyLen bounds Job.ConcurrencyKey, which is part of a Redis
// key.
const MaxConcurrencyKeyLen = 256

// validConcurrencyKey refuses a key the value format does not hold.
func validConcurrencyKey(k string) error {
	switch {
	case len(k) > MaxConcurrencyKeyLen:
		return fmt.Errorf("%w: ConcurrencyKey is %d bytes, limit %d", ErrInvalid, len(k), MaxConcurrencyKeyLen)
	case strings.ContainsAny(k, "{}"):
		return fmt.Errorf("%w: ConcurrencyKey %q contains a brace", ErrInvalid, k)
	}
	return nil
}
