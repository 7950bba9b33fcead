package jobkey

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// IfExists says what an enqueue does when a job exists under its ID, by
// the state of the stored job. Whatever it says, the decision is made in
// the enqueue's one compare-and-set on the stored value, and no job is
// ever made claimable while the stored job's last run may still hold its
// lease (docs/design.md, section 8): a replaced job is due at the end of
// that lease at the earliest, and an active job is never replaced.
//
//	policy                  pending         active   finished (succeeded, failed, canceled)
//	IfExistsRefuse          refuse          refuse   refuse
//	IfExistsKeep            keep            keep     keep
//	IfExistsReplaceFinished keep            keep     replace: a new run
//	IfExistsReplace         replace         refuse   replace: a new run
//
// Refuse writes nothing and returns the stored job with an error that
// matches ErrJobExists (*JobExistsError), as an enqueue of a taken ID
// always did. Keep writes nothing and returns the stored job with no
// error. Replace writes the new job in place of the stored one, under its
// ID: type, payload, RunAt and every option are the new enqueue's, its
// attempts start from zero, its CreatedAt is the time of the write, and
// the stored job's result and last error are gone. The last run's lease
// (LeaseOwner, LeaseUntil, LeaseToken) is kept, so that it still bounds a
// handler that may be stopping.
type IfExists uint8

const (
	// IfExistsRefuse refuses the enqueue whatever the stored job's state
	// (the default): the ID stays taken for the job's whole retention.
	IfExistsRefuse IfExists = iota
	// IfExistsKeep keeps the stored job, whatever its state, and returns
	// it with no error: an idempotent enqueue. Use IfExistsRefuse to learn
	// whether the job was new.
	IfExistsKeep
	// IfExistsReplaceFinished makes the ID unique while the job is
	// unfinished: a pending or active job is kept and returned with no
	// error; a succeeded, failed or canceled one is replaced by the new
	// job, a new run (asynq's Unique, BullMQ's deduplication until the job
	// completes or fails).
	IfExistsReplaceFinished
	// IfExistsReplace debounces: a pending job takes the new job's payload,
	// RunAt and options (the latest enqueue wins, and a Delay pushes the
	// run back again), a finished one is replaced by a new run, and an
	// active one is refused (ErrJobExists with the active job): its
	// handler has read the arguments, so the new ones would be lost; enqueue
	// again once it finished.
	IfExistsReplace
)

// String names the policy as its constant does, without the prefix.
func (p IfExists) String() string {
	switch p {
	case IfExistsRefuse:
		return "refuse"
	case IfExistsKeep:
		return "keep"
	case IfExistsReplaceFinished:
		return "replace-finished"
	case IfExistsReplace:
		return "replace"
	}
	return fmt.Sprintf("IfExists(%d)", uint8(p))
}

// ParseIfExists is the policy String names, for flags and configuration.
func ParseIfExists(s string) (IfExists, error) {
	for p := IfExistsRefuse; p <= IfExistsReplace; p++ {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: IfExists %q: want refuse, keep, replace-finished or replace", ErrInvalid, s)
}

// conflict is what an enqueue does with a stored job.
type conflict uint8

const (
	conflictRefuse conflict = iota
	conflictKeep
	conflictReplace
)

// on is what policy p does with a stored job in state s. A state this
// build does not know is refused: nothing is written over what it cannot
// judge.
func (p IfExists) on(s State) conflict {
	switch {
	case p == IfExistsKeep:
		return conflictKeep
	case p == IfExistsReplaceFinished && (s == StatePending || s == StateActive):
		return conflictKeep
	case (p == IfExistsReplaceFinished || p == IfExistsReplace) && s.Finished(),
		p == IfExistsReplace && s == StatePending:
		return conflictReplace
	}
	return conflictRefuse
}

// replaces says whether p may write over a stored job.
func (p IfExists) replaces() bool { return p == IfExistsReplaceFinished || p == IfExistsReplace }

// replacing is the job an enqueue writes in place of cur, its times set by
// now: in's job, with cur's last-run lease, and not due before that lease
// ends (lastrun.go). Fields a newer build appended to cur are kept, as
// every transition keeps them.
func replacing(in *enqueueIn, cur *Job, now time.Time) *Job {
	j := in.job
	j.CreatedAt, j.UpdatedAt, j.RunAt = now, now, in.runAt
	if !in.fixed {
		j.RunAt = now.Add(in.delay)
	}
	j.RunAt = dueAfterLastRun(cur, j.RunAt)
	j.LeaseOwner, j.LeaseUntil, j.LeaseToken = cur.LeaseOwner, cur.LeaseUntil, cur.LeaseToken
	j.future = cur.future
	return j
}

// keptError is the outcome of an enqueue that kept the stored job: not an
// error to the caller, who gets Job and nil.
type keptError struct{ job *Job }

func (e *keptError) Error() string { return "jobkey: job " + e.job.ID + " kept" }

// UniqueBy derives a job's ID from what makes two jobs the same work, so
// that enqueues of the same work meet under one ID and EnqueueOpts.IfExists
// decides what the later ones do. Set it in EnqueueOpts in place of ID.
//
// The ID is "u-" and the first 128 bits, in hex, of a SHA-256 over the
// job's type, its arguments and, with a Period, the period's start. It is
// a pure function of those (UniqueID, UniqueArgsID), the same in every
// process and, as its "v1" tag promises, in every later version: a change
// of derivation would get a new tag and a new prefix. With a
// ConcurrencyKey on a queue of several shards the job's ID is
// Queue.IDFor(key, that ID).
type UniqueBy struct {
	// Fields are the arguments that make two jobs the same, by their
	// msgpack names (a struct field's msgpack tag, else its name); the
	// others, a request ID or a timestamp say, do not count. The payload
	// must be a msgpack map (EnqueueArgs writes one for a struct). A field
	// the payload lacks counts as nil. Empty means every argument: with
	// EnqueueArgs, every field; with Enqueue, the payload's bytes as they
	// are.
	Fields []string
	// Period, when set, makes the ID one per period: the periods are the
	// multiples of Period since the Unix epoch, as Every's ticks are, and
	// jobs enqueued within one share the ID ("once per hour"). Whole
	// milliseconds, at least one.
	//
	// Enqueue places the job in the period that holds Redis's clock, as its
	// Queue knows it: the job's key must be named before the first round
	// trip of its compare-and-set, where Redis's TIME is read, so the
	// Queue's estimate (its last reading of TIME plus the local monotonic
	// time since) stands for it; a Queue that never read TIME asks for it
	// once. Processes so agree to within a round trip or so, where their
	// hosts' clocks may differ by seconds, and the job's CreatedAt, set by
	// the same clock, lies in its period but for that margin. An enqueue
	// within that margin of a period's end may fall in either period. A
	// caller who wants its own clock computes the ID with UniqueID or
	// UniqueArgsID at a time of its choosing and sets EnqueueOpts.ID.
	Period time.Duration
}

// uniqueTag versions the derivation: hashed first, and never reused.
const uniqueTag = "jobkey/unique/v1"

// valid refuses a UniqueBy no ID can be derived from.
func (u *UniqueBy) valid() error {
	if u.Period < 0 || u.Period%time.Millisecond != 0 {
		return fmt.Errorf("%w: UniqueBy.Period is %v, want 0 or whole milliseconds", ErrInvalid, u.Period)
	}
	for _, f := range u.Fields {
		if f == "" {
			return fmt.Errorf("%w: UniqueBy.Fields holds an empty name", ErrInvalid)
		}
	}
	return nil
}

// UniqueID is the ID UniqueBy derives for a job of type typ and payload,
// enqueued with Enqueue at time at (which matters only with a Period). It
// is what Enqueue derives, at its estimate of Redis's clock; with a
// ConcurrencyKey on several shards, pass it to Queue.IDFor.
func UniqueID(typ string, payload []byte, by UniqueBy, at time.Time) (string, error) {
	material := payload
	if len(by.Fields) > 0 {
		var err error
		if material, err = canonicalArgs(payload, by.Fields); err != nil {
			return "", err
		}
	}
	return uniqueID(typ, material, by, at)
}

// UniqueArgsID is the ID UniqueBy derives for typed arguments enqueued
// with EnqueueArgs at time at: from the canonical encoding of the Fields
// of args (every field when Fields is empty), so that reordering a
// struct's fields, or the order a map's entries are encoded in, does not
// change it.
func UniqueArgsID[T Args](args T, by UniqueBy, at time.Time) (string, error) {
	payload, err := msgpack.Marshal(args)
	if err != nil {
		return "", fmt.Errorf("%w: encode %s args: %w", ErrInvalid, args.Kind(), err)
	}
	material, err := canonicalArgs(payload, by.Fields)
	if err != nil {
		return "", err
	}
	return uniqueID(args.Kind(), material, by, at)
}

// uniqueID is the ID by derives for spec, in the period that holds Redis's
// clock as q knows it (UniqueBy.Period says why).
func (q *Queue) uniqueID(ctx context.Context, spec JobSpec, by *UniqueBy) (string, error) {
	if err := by.valid(); err != nil {
		return "", err
	}
	var at time.Time
	if by.Period > 0 {
		var err error
		if at, err = q.clock.Now(ctx, q.rdb); err != nil {
			return "", err
		}
	}
	material := spec.Payload
	if spec.typed || len(by.Fields) > 0 {
		var err error
		if material, err = canonicalArgs(spec.Payload, by.Fields); err != nil {
			return "", err
		}
	}
	return uniqueID(spec.Type, material, *by, at)
}

// uniqueID hashes the derivation's inputs, each framed by its length.
func uniqueID(typ string, material []byte, by UniqueBy, at time.Time) (string, error) {
	if err := by.valid(); err != nil {
		return "", err
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range [][]byte{[]byte(uniqueTag), []byte(typ), material} {
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		_, _ = h.Write(part)
	}
	var start int64
	if p := by.Period.Milliseconds(); p > 0 {
		ms := at.UnixMilli()
		start = ms - ((ms%p)+p)%p // floor, before the epoch too
	}
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(by.Period.Milliseconds())))
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(start)))
	return "u-" + hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// canonicalArgs is the canonical encoding of the entries fields of a
// msgpack map payload (every entry when fields is empty): a map of the
// entries sorted by name, each value decoded and encoded again with map
// keys sorted and integers in their shortest form, so that equal
// arguments encode alike however the producer ordered or sized them.
func canonicalArgs(payload []byte, fields []string) ([]byte, error) {
	// The caller's payload: checked as DecodeArgs checks a stored one
	// before the reflective decoder sees it, and refused as invalid input.
	d := newDecoder(payload, false)
	err := d.SkipDepth("UniqueBy args", 0, maxArgsDepth)
	switch {
	case err != nil:
	case d.Off != len(d.B):
		err = fmt.Errorf("%d trailing bytes", len(d.B)-d.Off)
	case d.Elems > argsDecodeBudget/elemCost(anyMapType):
		err = fmt.Errorf("%d elements, over the decode budget", d.Elems)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: UniqueBy needs a payload that is one msgpack map: %w", ErrInvalid, err)
	}
	var m map[string]any
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("%w: UniqueBy needs a payload that is a msgpack map with string keys: %v", ErrInvalid, err)
	}
	names := slices.Clone(fields)
	if len(names) == 0 {
		for k := range m {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	sel := make(map[string]any, len(names))
	for _, k := range names {
		sel[k] = m[k]
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(sel); err != nil {
		return nil, fmt.Errorf("%w: UniqueBy: encode args: %w", ErrInvalid, err)
	}
	return buf.Bytes(), nil
}
