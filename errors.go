package jobkey

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// Sentinels: compare with errors.Is. Where a typed error carries more, it
// says so.
var (
	// ErrNotFound reports that no job exists under the given ID.
	ErrNotFound = errors.New("jobkey: job not found")
	// ErrNoJob reports that no job was due when a claim looked.
	ErrNoJob = errors.New("jobkey: no job due")
	// ErrLeaseLost reports that the caller no longer holds the job's lease:
	// it expired and the job was claimed again, or the job was canceled or
	// finished; or, for a write of Work's (OnRecorded), the run's lease had
	// run out by this process's clock before the write was tried, as a
	// stuck handler's late write does. Nothing was written.
	ErrLeaseLost = errors.New("jobkey: lease lost")
	// ErrJobExists reports an enqueue with a caller ID that is already taken.
	// The existing job is returned beside it; nothing was written.
	ErrJobExists = errors.New("jobkey: job already exists")
	// ErrConflict reports that a compare-and-set gave up after other clients
	// kept changing the job. Nothing was written. The error is a
	// *ConflictError that says how many attempts were made.
	ErrConflict = cas.ErrConflict
	// ErrWrongType reports a key that holds a Redis type jobkey did not put
	// there. The call that met it wrote nothing, except a bulk action, whose
	// *BulkError counts what it did before. The error is a *WrongTypeError.
	ErrWrongType = cas.ErrWrongType
	// ErrStep reports that a step of an EXEC errored; the error is a
	// *StepError with every step's result.
	ErrStep = cas.ErrStep
	// ErrInvalid reports an argument jobkey refuses before it talks to
	// Redis: a bad ID, type, option or setting. Nothing was written.
	ErrInvalid = errors.New("jobkey: invalid argument")
	// ErrCorrupt reports a stored value that cannot be decoded. The bytes are
	// left in Redis untouched; the error says what was wrong and where.
	ErrCorrupt = errors.New("jobkey: corrupt job value")
	// ErrUnsupportedFormat reports a value written in a format major version
	// this build does not know, typically by a newer jobkey.
	ErrUnsupportedFormat = errors.New("jobkey: unsupported job value format")
	// ErrTooLarge reports a job whose encoded value would exceed the limit.
	ErrTooLarge = errors.New("jobkey: job value too large")
	// ErrEvictionPolicy reports a Redis whose maxmemory-policy may evict the
	// keys of pending and active jobs (allkeys-lru, allkeys-lfu,
	// allkeys-random): jobs it acknowledged could vanish without a trace.
	// Nothing was written.
	ErrEvictionPolicy = errors.New("jobkey: Redis may evict acknowledged jobs")
	// ErrUnreachable reports that Redis could not be reached: a connection
	// could not be made, or broke. The error is an *UnreachableError that
	// names the address.
	ErrUnreachable = errors.New("jobkey: Redis could not be reached")
	// ErrState reports an operation that the job's state does not allow,
	// such as canceling a job that already succeeded. Nothing was written.
	// The error is a *StateError that names the state.
	ErrState = errors.New("jobkey: not allowed in the job's state")
	// ErrOutcomeUnknown reports a write that may or may not have been
	// applied: its EXEC was sent and no reply came back (the connection
	// broke, or Redis was too slow), or the caller's context ended while a
	// group commit carried it. Calling again resolves it: an Enqueue with
	// the same ID gets ErrJobExists if the first one landed, and a
	// Complete, Fail or Release recognises its own write.
	ErrOutcomeUnknown = cas.ErrOutcomeUnknown
	// ErrArgs reports a job whose payload is well-formed msgpack that does
	// not decode into its handler's argument type. The error is an
	// *ArgsError.
	ErrArgs = errors.New("jobkey: job arguments do not decode")
	// ErrSkipRetry, wrapped into a handler's error, fails the job for good
	// whatever attempts it has left.
	ErrSkipRetry = errors.New("jobkey: do not retry")
	// ErrHandlerStuck is returned by Work when it shut down without
	// handlers that had not returned WorkOpts.StuckAfter after their
	// contexts ended: Go cannot stop them. The error names their jobs.
	// Work no longer renews their leases, so once a lease runs out the job
	// may run again elsewhere while its handler here still runs.
	ErrHandlerStuck = errors.New("jobkey: handler stuck: it ignored its context")
)

// Causes of a handler's context being canceled, for context.Cause.
var (
	// ErrJobCanceled is the cause when the job was canceled while running.
	ErrJobCanceled = errors.New("jobkey: job canceled")
	// ErrShutdown is the cause when shutdown's grace period ran out; the job
	// is released back to pending without spending its attempt.
	ErrShutdown = errors.New("jobkey: worker shutting down")
	// ErrLeaseExpired is the cause when the lease could not be renewed
	// (Redis unreachable, or too slow) and its last confirmed deadline, less
	// WorkOpts.LeaseMargin, passed: the worker stops the handler before
	// another worker may claim the job. Nothing is written; the job is
	// claimed again once the lease has run out in Redis.
	ErrLeaseExpired = errors.New("jobkey: lease could not be renewed before it ran out")
	// ErrTimeout is the cause when the job's Timeout (or WorkOpts.Timeout)
	// ran out: a handler that returns an error then fails the attempt, with
	// a cause that says "timeout", and the job is retried under backoff.
	ErrTimeout = errors.New("jobkey: timeout: the handler ran past the job's timeout")
	// ErrDeadline is the cause when the job's Deadline passed during a run
	// (ctx.Err() is then context.DeadlineExceeded), and what the attempt of
	// a job claimed after its Deadline fails with, unrun: the attempt fails
	// and the job is retried under backoff while attempts remain.
	ErrDeadline = errors.New("jobkey: deadline: the job's deadline passed")
)

// outcomeUnknown is the error of a call whose context ended while the
// group commit that carries it was in flight (cas.OutcomeUnknown).
var outcomeUnknown = cas.OutcomeUnknown

// wrapped is an error whose message says "jobkey: " once, however many
// jobkey errors it wraps: msg, then the wrapped error's message without
// its own "jobkey: ". errors.Is and errors.As see every error of errs.
type wrapped struct {
	msg  string // begins with "jobkey: "
	errs []error
}

func (e *wrapped) Error() string { return e.msg + ": " + bare(e.errs[len(e.errs)-1]) }

// bare is err's message without its "jobkey: ", for a message that wraps
// it and already says "jobkey: ".
func bare(err error) string { return strings.TrimPrefix(err.Error(), "jobkey: ") }

// Unwrap returns the wrapped errors, for errors.Is and errors.As.
func (e *wrapped) Unwrap() []error { return e.errs }

// wrapf is fmt.Errorf("jobkey: "+format+": %w", args..., err), with
// "jobkey: " said once.
func wrapf(err error, format string, args ...any) error {
	return &wrapped{msg: "jobkey: " + fmt.Sprintf(format, args...), errs: []error{err}}
}

// skipRetry wraps err so that it fails the job for good: "jobkey: do not
// retry: <err without its jobkey: prefix>".
func skipRetry(err error) error {
	return &wrapped{msg: ErrSkipRetry.Error(), errs: []error{ErrSkipRetry, err}}
}

// BatchError is the error of a batch call (EnqueueMany, CompleteMany) in
// which some jobs did not get the outcome asked for. Errs has one entry
// per job of the batch, in order: nil for the jobs that got it, else that
// job's own error. A batch runs as several transactions (one per
// Config.MaxBatch jobs, one per shard on a cluster); each transaction
// writes all of its jobs or none, so when one fails after others
// committed, Errs tells exactly which jobs were written. errors.Is and
// errors.As see every job's error.
type BatchError struct {
	Errs []error
}

func (e *BatchError) Error() string {
	failed, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed == 0 {
		return "jobkey: batch: no errors"
	}
	return fmt.Sprintf("jobkey: %d of %d jobs in the batch failed; the first, job %d: %s", failed, len(e.Errs), first, bare(e.Errs[first]))
}

// Unwrap returns the jobs' errors, for errors.Is and errors.As.
func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// batchErr returns a *BatchError for errs, or nil when every entry is nil.
func batchErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return &BatchError{Errs: errs}
		}
	}
	return nil
}

// ConflictError reports a compare-and-set that was aborted by concurrent
// writers on every attempt: its Key (the first watched key) and how many
// Attempts were made. It matches ErrConflict.
type ConflictError = cas.ConflictError

// WrongTypeError names a Key whose Redis type (Got) is not the one jobkey
// needs (Want, e.g. "zset" or "string"). It matches ErrWrongType.
type WrongTypeError = cas.WrongTypeError

// StepResult is the outcome of one command inside a MULTI/EXEC: the
// command and its key (Cmd, e.g. "zadd jobkey:{q/0}:ready"), and Err, nil
// when the step applied.
type StepResult = cas.StepResult

// StepError lists the result of every step of an EXEC in which at least
// one step errored. Redis does not roll back a transaction, so the steps
// without an error did apply; the list is the only record of which.
// Aborted is true when Redis refused the transaction as a whole
// (EXECABORT: a command was rejected while queued), so no step applied. It
// matches ErrStep.
type StepError = cas.StepError

// ErrNotReplicated reports a write that Redis applied on the master but
// that fewer than Config.MinReplicas replicas confirmed within
// Config.ReplicaTimeout: it is not yet safe from a failover. The error is
// a *ReplicationError. Calling again with the same job (the same ID) is
// safe: an Enqueue gets ErrJobExists, and a Complete, Fail or Release
// recognises its own write; either then waits for the replicas again.
var ErrNotReplicated = cas.ErrNotReplicated

// ReplicationError is the detail behind ErrNotReplicated: the write to Key
// was applied on the master, and Acked of the Want replicas confirmed it
// within Timeout; Err says why WAIT gave no count (a broken link, an ACL
// without +wait), or is nil. It is not yet safe: a failover before the
// replicas catch up may lose it. Call again with the same ID.
type ReplicationError = cas.ReplicationError

// LeaseLostError explains ErrLeaseLost: the caller's claim, and the job as
// it is now stored.
type LeaseLostError struct {
	ID      string
	Attempt int    // the caller's attempt
	Owner   string // the caller's lease owner
	Token   uint64 // the caller's lease token
	Now     *Job   // the stored job
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("jobkey: lease lost on job %q: attempt %d of %q, but the job is now %s at attempt %d of %q",
		e.ID, e.Attempt, e.Owner, e.Now.State, e.Now.Attempt, e.Now.LeaseOwner)
}

// Is makes errors.Is(err, ErrLeaseLost) hold.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// ShardsError reports the shards of a queue that a call could not read:
// their cluster node is down, or an index holds the wrong type. What the
// call returned covers the other shards. For a call that writes every
// shard (Pause, Resume), Write is set: the shards named were not written,
// the others were; with Config.MinReplicas, a shard whose error matches
// ErrNotReplicated was written on the master only.
type ShardsError struct {
	Shards []int   // the shards left out, in order
	Of     int     // how many shards the queue has
	Errs   []error // why, one per shard in Shards
	Write  bool    // the shards could not be written (else: read)
}

func (e *ShardsError) Error() string {
	verb := "read"
	if e.Write {
		verb = "written"
	}
	var lost, masterOnly []int
	first := -1
	for i, s := range e.Shards {
		if e.Write && errors.Is(e.Errs[i], ErrNotReplicated) {
			masterOnly = append(masterOnly, s)
			continue
		}
		lost = append(lost, s)
		if first < 0 {
			first = i
		}
	}
	if len(masterOnly) == 0 {
		return fmt.Sprintf("jobkey: %d of %d shards could not be %s (%v); the first: %s", len(e.Shards), e.Of, verb, e.Shards, bare(e.Errs[0]))
	}
	msg := fmt.Sprintf("jobkey: %d of %d shards were written on the master only, not confirmed by the replicas (%v): a failover may undo them", len(masterOnly), e.Of, masterOnly)
	if len(lost) > 0 {
		msg += fmt.Sprintf("; %d could not be written (%v); the first: %s", len(lost), lost, bare(e.Errs[first]))
	}
	return msg
}

// Unwrap returns the shards' errors, for errors.Is and errors.As.
func (e *ShardsError) Unwrap() []error { return e.Errs }

func (e *ShardsError) add(shard int, err error) {
	e.Shards = append(e.Shards, shard)
	e.Errs = append(e.Errs, err)
}

// orNil returns e when it names a shard, else nil.
func (e *ShardsError) orNil() error {
	if len(e.Shards) == 0 {
		return nil
	}
	return e
}

// UnreachableError is the detail behind ErrUnreachable: where Redis was
// looked for, and the network's error.
type UnreachableError struct {
	Addr string // host:port (for a cluster, its seed addresses); never a password
	Err  error  // the network's error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("jobkey: Redis at %s could not be reached: %v", cmp.Or(e.Addr, "(unknown address)"), e.Err)
}

// Unwrap returns Err.
func (e *UnreachableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnreachable) hold.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// CorruptError is the detail behind ErrCorrupt: which field was malformed,
// at which byte offset, and how.
type CorruptError struct {
	Key    string // the Redis key holding the value, when known
	Field  string // the field being decoded, e.g. "Payload"
	Offset int    // byte offset into the value where decoding failed
	Reason string // what was wrong
}

func (e *CorruptError) Error() string {
	where := ""
	if e.Key != "" {
		where = fmt.Sprintf(" at key %q", e.Key)
	}
	return fmt.Sprintf("jobkey: corrupt job value%s: %s at byte %d: %s", where, e.Field, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) hold for every CorruptError.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// ArgsError reports a job whose arguments, well-formed msgpack, do not
// decode into the handler's type: typically a field whose type changed
// between deploys. During a rolling deploy a worker of the other deploy may
// decode them, so HandleArgs returns it as an ordinary failure, retried
// under Config.Backoff; the payload is left as it is.
type ArgsError struct {
	ID   string // the job
	Kind string // its type, Args.Kind()
	Type string // the Go type decoded into, e.g. "main.ResizeArgs"
	// Field is the top-level field whose value does not decode, when the
	// arguments are a map and one entry fails on its own; else "".
	Field string
	Err   error // the decoder's error
}

func (e *ArgsError) Error() string {
	field := ""
	if e.Field != "" {
		field = fmt.Sprintf(": field %q", e.Field)
	}
	return fmt.Sprintf("jobkey: arguments of %s job %q do not decode into %s%s: %v", e.Kind, e.ID, e.Type, field, e.Err)
}

// Unwrap returns the decoder's error.
func (e *ArgsError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrArgs) hold.
func (e *ArgsError) Is(target error) bool { return target == ErrArgs }

// JobExistsError reports an enqueued ID that was already taken. Job is the
// stored job; nothing was written for it.
type JobExistsError struct {
	Index int  // position in the EnqueueMany batch (0 for Enqueue)
	Job   *Job // the job already stored under the ID
}

func (e *JobExistsError) Error() string {
	return fmt.Sprintf("jobkey: job %q already exists (state %s)", e.Job.ID, e.Job.State)
}

// Is makes errors.Is(err, ErrJobExists) hold.
func (e *JobExistsError) Is(target error) bool { return target == ErrJobExists }

// StateError reports an operation that the job's current state does not
// allow, such as canceling a job that already succeeded.
type StateError struct {
	ID    string
	Op    string // "cancel", "retry", ...
	State State  // the state the job is in
	// Running, when set, is the end of the lease of a run that was
	// canceled and may still be stopping (the job may have been retried, or
	// canceled again, since): Delete waits for it, so that the ID cannot be
	// enqueued again and run beside that handler.
	Running time.Time
}

func (e *StateError) Error() string {
	if !e.Running.IsZero() {
		return fmt.Sprintf("jobkey: cannot %s job %q: it was canceled while it ran, and its handler may run until its lease ends at %s",
			e.Op, e.ID, e.Running.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("jobkey: cannot %s job %q: it is %s", e.Op, e.ID, e.State)
}

// Is makes errors.Is(err, ErrState) hold.
func (e *StateError) Is(target error) bool { return target == ErrState }
