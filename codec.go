package jobkey

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MaxValueBytes is the hard ceiling on an encoded job value. The codec
// refuses to encode or decode anything larger, whatever a header claims.
// Config.MaxValueBytes sets a lower, per-queue limit.
const MaxValueBytes = 64 << 20

// Format versions of the stored job value. The major version changes only
// when an old reader could misread a new value; a minor version may only
// append fields, which older readers skip.
//
// Minor versions of major 1:
//
//	1.0  17 elements: the versions, then ID through Rev
//	1.1  18 elements: LeaseToken appended
const (
	formatMajor = 1
	formatMinor = 1
)

// v1Fields is the number of array elements of a v1.0 value, including the
// two version elements; values with fewer are corrupt. knownFields is the
// number this build writes. Values with more come from a newer minor
// version, whose extra fields are skipped.
const (
	v1Fields    = 17
	knownFields = 18
)

// MaxAttemptsLimit bounds Attempt and MaxAttempts, as stored in a value.
const MaxAttemptsLimit = math.MaxInt32

// maxSkipDepth bounds how deeply nested an unknown appended field may be.
const maxSkipDepth = 16

var (
	// ErrCorrupt reports a stored value that cannot be decoded. The bytes are
	// left in Redis untouched; the error says what was wrong and where.
	ErrCorrupt = errors.New("jobkey: corrupt job value")
	// ErrUnsupportedFormat reports a value written in a format major version
	// this build does not know, typically by a newer jobkey.
	ErrUnsupportedFormat = errors.New("jobkey: unsupported job value format")
	// ErrTooLarge reports a job whose encoded value would exceed the limit.
	ErrTooLarge = errors.New("jobkey: job value too large")
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

// minor is the minor version to write: this build's, or the newer one
// whose fields the job carries.
func (j *Job) minor() uint64 { return max(formatMinor, j.future.minor) }

// Marshal encodes j in the current value format. The result is allocated
// once, at its exact size.
func Marshal(j *Job) ([]byte, error) {
	if j == nil {
		return nil, errors.New("jobkey: marshal nil job")
	}
	// Refuse whatever Unmarshal would refuse, so a value that was written
	// can always be read back.
	switch {
	case !j.State.Valid():
		return nil, fmt.Errorf("%w: marshal job %q: invalid state %d", ErrInvalid, j.ID, uint8(j.State))
	case j.Attempt < 0 || j.Attempt > MaxAttemptsLimit:
		return nil, fmt.Errorf("%w: marshal job %q: Attempt %d, want 0..%d", ErrInvalid, j.ID, j.Attempt, MaxAttemptsLimit)
	case j.MaxAttempts < 0 || j.MaxAttempts > MaxAttemptsLimit:
		return nil, fmt.Errorf("%w: marshal job %q: MaxAttempts %d, want 0..%d", ErrInvalid, j.ID, j.MaxAttempts, MaxAttemptsLimit)
	}
	n := encodedSize(j)
	if n > MaxValueBytes {
		return nil, fmt.Errorf("%w: job %q encodes to %d bytes, limit %d", ErrTooLarge, j.ID, n, MaxValueBytes)
	}
	return appendJob(make([]byte, 0, n), j), nil
}

// encodedSize is the exact length appendJob produces, so Marshal allocates
// once and oversized jobs are refused before any encoding work.
func encodedSize(j *Job) int {
	return arrayHdrSize(knownFields+j.future.n) +
		uintSize(formatMajor) + uintSize(j.minor()) +
		strSize(j.ID) + strSize(j.Queue) + strSize(j.Type) + binSize(len(j.Payload)) +
		uintSize(uint64(j.State)) + intSize(int64(j.Attempt)) + intSize(int64(j.MaxAttempts)) +
		intSize(toMillis(j.RunAt)) + strSize(j.LeaseOwner) + intSize(toMillis(j.LeaseUntil)) +
		strSize(j.LastError) + binSize(len(j.Result)) +
		intSize(toMillis(j.CreatedAt)) + intSize(toMillis(j.UpdatedAt)) + uintSize(j.Rev) +
		uintSize(j.LeaseToken) + len(j.future.raw)
}

// appendJob writes the v1 array. The field order is the wire format: new
// fields may only be appended, in a new minor version.
func appendJob(b []byte, j *Job) []byte {
	b = appendArrayHdr(b, knownFields+j.future.n)
	b = appendUint(b, formatMajor)
	b = appendUint(b, j.minor())
	b = appendStr(b, j.ID)
	b = appendStr(b, j.Queue)
	b = appendStr(b, j.Type)
	b = appendBin(b, j.Payload)
	b = appendUint(b, uint64(j.State))
	b = appendInt(b, int64(j.Attempt))
	b = appendInt(b, int64(j.MaxAttempts))
	b = appendInt(b, toMillis(j.RunAt))
	b = appendStr(b, j.LeaseOwner)
	b = appendInt(b, toMillis(j.LeaseUntil))
	b = appendStr(b, j.LastError)
	b = appendBin(b, j.Result)
	b = appendInt(b, toMillis(j.CreatedAt))
	b = appendInt(b, toMillis(j.UpdatedAt))
	b = appendUint(b, j.Rev)
	b = appendUint(b, j.LeaseToken) // 1.1
	return append(b, j.future.raw...)
}

// Unmarshal decodes a stored value into j, which is zeroed first. It never
// allocates more than the input could hold, and it never panics: malformed
// input returns an error matching ErrCorrupt (or ErrUnsupportedFormat for an
// unknown major version) that names the field and byte offset.
func Unmarshal(data []byte, j *Job) error {
	if j == nil {
		return errors.New("jobkey: unmarshal into nil job")
	}
	// One copy of the input backs every string and byte field of the result:
	// one allocation per decode, and the Job never aliases the caller's buffer.
	return decodeJob(decoder{b: bytes.Clone(data), own: true}, j)
}

// unmarshalString decodes a value held in a string, as go-redis returns it.
// A string never changes, so the Job's strings share its memory; only the
// byte fields, which callers may modify, are copied.
func unmarshalString(s string, j *Job) error {
	return decodeJob(decoder{b: unsafe.Slice(unsafe.StringData(s), len(s))}, j)
}

func decodeJob(d decoder, j *Job) error {
	*j = Job{}
	if len(d.b) > MaxValueBytes {
		return fmt.Errorf("%w: value is %d bytes, limit %d", ErrTooLarge, len(d.b), MaxValueBytes)
	}
	n, err := d.arrayLen("value")
	if err != nil {
		return err
	}
	if n < 2 {
		return d.corrupt("value", fmt.Sprintf("array of %d elements has no version", n))
	}
	major, err := d.uint("format major version", math.MaxUint32)
	if err != nil {
		return err
	}
	if major != formatMajor {
		return fmt.Errorf("%w: major version %d, this build reads %d", ErrUnsupportedFormat, major, formatMajor)
	}
	minor, err := d.uint("format minor version", math.MaxUint32)
	if err != nil {
		return err
	}
	if n < v1Fields {
		return d.corrupt("value", fmt.Sprintf("array of %d elements, v1 needs %d", n, v1Fields))
	}
	var out Job
	if err := d.fields(&out); err != nil {
		return err
	}
	if n > v1Fields {
		if out.LeaseToken, err = d.uint("LeaseToken", math.MaxUint64); err != nil {
			return err
		}
	}
	// Fields appended by a newer minor version are checked to be well
	// formed and kept as they are, to be written back unchanged.
	start := d.off
	for i := knownFields; i < n; i++ {
		if err := d.skip(fmt.Sprintf("appended field %d", i), 0); err != nil {
			return err
		}
	}
	if n > knownFields {
		out.future = futureFields{minor: minor, n: n - knownFields, raw: d.b[start:d.off:d.off]}
	}
	if d.off != len(d.b) {
		return d.corrupt("value", fmt.Sprintf("%d trailing bytes", len(d.b)-d.off))
	}
	*j = out
	return nil
}

// fields decodes the v1 fields in wire order.
func (d *decoder) fields(j *Job) error {
	var err error
	str := func(name string, dst *string) {
		if err == nil {
			*dst, err = d.str(name)
		}
	}
	bin := func(name string, dst *[]byte) {
		if err == nil {
			*dst, err = d.bin(name)
		}
	}
	num := func(name string, dst *int) {
		if err == nil {
			var v int64
			v, err = d.int(name, 0, MaxAttemptsLimit)
			*dst = int(v)
		}
	}
	tm := func(name string, dst *time.Time) {
		if err == nil {
			var v int64
			v, err = d.int(name, math.MinInt64, math.MaxInt64)
			*dst = fromMillis(v)
		}
	}
	str("ID", &j.ID)
	str("Queue", &j.Queue)
	str("Type", &j.Type)
	bin("Payload", &j.Payload)
	if err == nil {
		at := d.off
		var s uint64
		s, err = d.uint("State", math.MaxUint8)
		j.State = State(s)
		if err == nil && !j.State.Valid() {
			err = corruptAt(at, "State", fmt.Sprintf("unknown state %d", s))
		}
	}
	num("Attempt", &j.Attempt)
	num("MaxAttempts", &j.MaxAttempts)
	tm("RunAt", &j.RunAt)
	str("LeaseOwner", &j.LeaseOwner)
	tm("LeaseUntil", &j.LeaseUntil)
	str("LastError", &j.LastError)
	bin("Result", &j.Result)
	tm("CreatedAt", &j.CreatedAt)
	tm("UpdatedAt", &j.UpdatedAt)
	if err == nil {
		j.Rev, err = d.uint("Rev", math.MaxUint64)
	}
	return err
}

// toMillis stores the zero time as 0, so "unset" survives a round trip.
func toMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// ---- encoding primitives -------------------------------------------------

func arrayHdrSize(n int) int {
	switch {
	case n <= 15:
		return 1
	case n <= math.MaxUint16:
		return 3
	}
	return 5
}

func appendArrayHdr(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, msgpcode.FixedArrayLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Array16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Array32), uint32(n))
}

func uintSize(v uint64) int {
	switch {
	case v <= uint64(msgpcode.PosFixedNumHigh):
		return 1
	case v <= math.MaxUint8:
		return 2
	case v <= math.MaxUint16:
		return 3
	case v <= math.MaxUint32:
		return 5
	}
	return 9
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= uint64(msgpcode.PosFixedNumHigh):
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, msgpcode.Uint8, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), v)
}

func intSize(v int64) int {
	switch {
	case v >= 0:
		return uintSize(uint64(v))
	case v >= -32:
		return 1
	case v >= math.MinInt8:
		return 2
	case v >= math.MinInt16:
		return 3
	case v >= math.MinInt32:
		return 5
	}
	return 9
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(int8(v)))
	case v >= math.MinInt8:
		return append(b, msgpcode.Int8, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Int16), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Int32), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Int64), uint64(v))
}

func strSize(s string) int {
	n := len(s)
	switch {
	case n <= 31:
		return 1 + n
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	}
	return 5 + n
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= 31:
		b = append(b, msgpcode.FixedStrLow|byte(n))
	case n <= math.MaxUint8:
		b = append(b, msgpcode.Str8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Str16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Str32), uint32(n))
	}
	return append(b, s...)
}

func binSize(n int) int {
	switch {
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	}
	return 5 + n
}

func appendBin(b []byte, p []byte) []byte {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, msgpcode.Bin8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Bin16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Bin32), uint32(n))
	}
	return append(b, p...)
}
