package cas

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The errors the engine makes. The root package re-exports each under the
// same name (jobkey.ErrConflict is ErrConflict), so errors.Is and errors.As
// see one identity whichever name a caller uses; the doc comments that
// callers read are there.
var (
	// ErrConflict: a compare-and-set gave up after other clients kept
	// changing its keys. Nothing was written.
	ErrConflict = errors.New("jobkey: too many conflicting writes")
	// ErrWrongType: a key holds a Redis type jobkey did not put there.
	ErrWrongType = errors.New("jobkey: key holds the wrong Redis type")
	// ErrStep: a step of an EXEC errored.
	ErrStep = errors.New("jobkey: a transaction step failed")
	// ErrOutcomeUnknown: a write that may or may not have been applied.
	ErrOutcomeUnknown = errors.New("jobkey: outcome unknown")
	// ErrNotReplicated: a write applied on the master that too few
	// replicas confirmed in time.
	ErrNotReplicated = errors.New("jobkey: write not confirmed by enough replicas")
)

// ConflictError reports a compare-and-set that was aborted by concurrent
// writers on every attempt.
type ConflictError struct {
	Key      string // the first watched key
	Attempts int    // how many times the transaction ran
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("jobkey: %s: gave up after %d attempts: too many conflicting writes", e.Key, e.Attempts)
}

// Is makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// WrongTypeError names a key whose Redis type is not the one jobkey needs.
type WrongTypeError struct {
	Key  string // the offending key
	Want string // the type jobkey needs, e.g. "zset" or "string"
	Got  string // the type found
}

func (e *WrongTypeError) Error() string {
	// What was written is the call's to say (a bulk action may have done
	// work before it met the key), not the key's.
	return fmt.Sprintf("jobkey: key %q holds a %s, want %s (or no key)", e.Key, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrWrongType) hold.
func (e *WrongTypeError) Is(target error) bool { return target == ErrWrongType }

// StepResult is the outcome of one command inside a MULTI/EXEC.
type StepResult struct {
	Cmd string // the command and its key, e.g. "zadd jobkey:{q/0}:ready"
	Err error  // nil when the step applied
}

// StepError lists the result of every step of an EXEC in which at least one
// step errored. Redis does not roll back a transaction, so the steps without
// an error did apply; the list is the only record of which.
type StepError struct {
	Steps []StepResult
	// Aborted is true when Redis refused the transaction as a whole
	// (EXECABORT: a command was rejected while queued), so no step applied.
	Aborted bool
}

func (e *StepError) Error() string {
	var b strings.Builder
	b.WriteString("jobkey: transaction step failed: [")
	for i, s := range e.Steps {
		if i > 0 {
			b.WriteString(", ")
		}
		switch {
		case s.Err != nil:
			b.WriteString("error")
		case e.Aborted:
			b.WriteString("discarded")
		default:
			b.WriteString("ok")
		}
	}
	b.WriteString("]")
	for _, s := range e.Steps {
		if s.Err != nil {
			fmt.Fprintf(&b, "; %s: %v", s.Cmd, s.Err)
		}
	}
	if e.Aborted {
		b.WriteString("; EXECABORT: nothing applied")
	}
	return b.String()
}

// Is makes errors.Is(err, ErrStep) hold.
func (e *StepError) Is(target error) bool { return target == ErrStep }

// ReplicationError is the detail behind ErrNotReplicated: the write was
// applied on the master, and Acked of the Want replicas confirmed it
// within Timeout. It is not yet safe: a failover before the replicas catch
// up may lose it. Call again with the same ID.
type ReplicationError struct {
	Key     string        // a key of the transaction (its routing key)
	Acked   int           // replicas that confirmed in time
	Want    int           // Config.MinReplicas
	Timeout time.Duration // Config.ReplicaTimeout
	Err     error         // why WAIT gave no count (a broken link, an ACL without +wait), or nil
}

func (e *ReplicationError) Error() string {
	msg := fmt.Sprintf("jobkey: write to %s applied on the master, but confirmed by %d of %d replicas within %v: not yet safe from a failover; call again with the same ID",
		e.Key, e.Acked, e.Want, e.Timeout)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrNotReplicated) hold.
func (e *ReplicationError) Is(target error) bool { return target == ErrNotReplicated }

// Unwrap returns Err.
func (e *ReplicationError) Unwrap() error { return e.Err }

// OutcomeUnknown is the error of a call whose context ended while the
// group commit that carries it was in flight. It matches ErrOutcomeUnknown
// and ctxErr, and says what the caller should do.
func OutcomeUnknown(op, id string, ctxErr error) error {
	var what string
	switch op {
	case "enqueue":
		what = fmt.Sprintf("enqueue %q: the context ended while its transaction was in flight, so the job may or may not be written: enqueue it again with the same ID (ErrJobExists then says it was)", id)
	case "claim":
		what = fmt.Sprintf("claim for worker %q: the context ended while its transaction was in flight; a job it claimed is given back", id)
	case "":
		what = "the context ended while the call was in flight, so it may or may not be written"
	default:
		what = fmt.Sprintf("%s %q: the context ended while its transaction was in flight, so it may or may not be written: call %s again", op, id, op)
	}
	return fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, what, ctxErr)
}
