package jobkey

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/jobkey/jobkey/internal/msgpk"
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
//	1.2  19 elements: Meta appended, a map of strings (an empty one is 0x80)
//	1.3  20 elements: Timeout appended, whole milliseconds (0: none)
//	1.4  21 elements: Priority appended, 0 to MaxPriority
//	1.5  22 elements: ConcurrencyKey appended, a string ("" : none)
//	1.6  24 elements: Retention appended, whole milliseconds (0: the
//	     queue's), then Deadline, unix milliseconds (0: none)
//	1.7  29 elements: Snoozes appended, a uint; StartedAt, unix
//	     milliseconds (0: never claimed); History, an array of records,
//	     each an array of 6 (Attempt, Started, Duration in milliseconds,
//	     Worker, Outcome, Error; history.go); HistoryDropped, a uint; and
//	     Progress, a bin
//	1.8  30 elements: Batch appended, a string ("": none)
const (
	formatMajor = 1
	formatMinor = 8
)

// v1Fields is the number of array elements of a v1.0 value, including the
// two version elements; values with fewer are corrupt. knownFields is the
// number this build writes (minorFields[formatMinor]). Values with more
// come from a newer minor version, whose extra fields are skipped.
const (
	v1Fields    = 17
	knownFields = v1Fields + 13
)

// minorFields[n] is the number of array elements minor version n writes:
// one more per version up to 1.5, two more in 1.6, five more in 1.7, one
// more in 1.8.
var minorFields = [formatMinor + 1]int{v1Fields, v1Fields + 1, v1Fields + 2, v1Fields + 3, v1Fields + 4, v1Fields + 5, v1Fields + 7, v1Fields + 12, knownFields}

// minorOf is the minor version of a build that knows the first known
// fields: the newest whose fields it knows all of.
func minorOf(known int) uint64 {
	var m uint64
	for i, n := range minorFields {
		if n <= known {
			m = uint64(i)
		}
	}
	return m
}

// MaxTimeout bounds a job's Timeout, as stored in a value.
const MaxTimeout = 7 * 24 * time.Hour

// MaxAttemptsLimit bounds Attempt and MaxAttempts, as stored in a value.
const MaxAttemptsLimit = math.MaxInt32

// maxSkipDepth bounds how deeply nested an unknown appended field may be.
const maxSkipDepth = 16

// Marshal encodes j in the current value format. The result is allocated
// once, at its exact size.
//
// Marshal and Unmarshal are API for tools that handle stored values
// without a Queue: one that inspects a value redis-cli printed, backs up
// and restores values, or keeps golden files of the format. A Queue never
// needs them from its caller.
func Marshal(j *Job) ([]byte, error) {
	n, err := marshalSize(j)
	if err != nil {
		return nil, err
	}
	return appendJob(make([]byte, 0, n), j), nil
}

// marshalSize refuses whatever Unmarshal would refuse, so a value that was
// written can always be read back, and returns the exact length appendJob
// writes for j.
func marshalSize(j *Job) (int, error) {
	if j == nil {
		return 0, errors.New("jobkey: marshal nil job")
	}
	switch {
	case !j.State.Valid():
		return 0, fmt.Errorf("%w: marshal job %q: invalid state %d", ErrInvalid, j.ID, uint8(j.State))
	case j.Attempt < 0 || j.Attempt > MaxAttemptsLimit:
		return 0, fmt.Errorf("%w: marshal job %q: Attempt %d, want 0..%d", ErrInvalid, j.ID, j.Attempt, MaxAttemptsLimit)
	case j.MaxAttempts < 0 || j.MaxAttempts > MaxAttemptsLimit:
		return 0, fmt.Errorf("%w: marshal job %q: MaxAttempts %d, want 0..%d", ErrInvalid, j.ID, j.MaxAttempts, MaxAttemptsLimit)
	}
	if err := validMeta(j.Meta); err != nil {
		return 0, fmt.Errorf("marshal job %q: %w", j.ID, err)
	}
	if j.Priority < 0 || j.Priority > MaxPriority {
		return 0, fmt.Errorf("%w: marshal job %q: Priority %d, want 0..%d", ErrInvalid, j.ID, j.Priority, MaxPriority)
	}
	if len(j.ConcurrencyKey) > MaxConcurrencyKeyLen {
		return 0, fmt.Errorf("%w: marshal job %q: ConcurrencyKey is %d bytes, limit %d", ErrInvalid, j.ID, len(j.ConcurrencyKey), MaxConcurrencyKeyLen)
	}
	if j.Timeout < 0 || j.Timeout > MaxTimeout || j.Timeout%time.Millisecond != 0 {
		return 0, fmt.Errorf("%w: marshal job %q: Timeout %v, want whole milliseconds in 0..%v", ErrInvalid, j.ID, j.Timeout, MaxTimeout)
	}
	if j.Retention < 0 || j.Retention > MaxRetention || j.Retention%time.Millisecond != 0 {
		return 0, fmt.Errorf("%w: marshal job %q: Retention %v, want whole milliseconds in 0..%v", ErrInvalid, j.ID, j.Retention, MaxRetention)
	}
	if j.Snoozes < 0 || j.Snoozes > MaxAttemptsLimit || j.HistoryDropped < 0 || j.HistoryDropped > MaxAttemptsLimit {
		return 0, fmt.Errorf("%w: marshal job %q: Snoozes %d, HistoryDropped %d, want 0..%d", ErrInvalid, j.ID, j.Snoozes, j.HistoryDropped, MaxAttemptsLimit)
	}
	if err := validHistory(j.History); err != nil {
		return 0, fmt.Errorf("marshal job %q: %w", j.ID, err)
	}
	if j.Batch != "" && validID(j.Batch) != nil {
		return 0, fmt.Errorf("%w: marshal job %q: Batch %q is not a valid job ID", ErrInvalid, j.ID, j.Batch)
	}
	if len(j.Progress) > MaxProgressBytes {
		return 0, fmt.Errorf("%w: marshal job %q: Progress is %d bytes, limit %d", ErrInvalid, j.ID, len(j.Progress), MaxProgressBytes)
	}
	n := encodedSize(j)
	if n > MaxValueBytes {
		return 0, fmt.Errorf("%w: job %q encodes to %d bytes, limit %d", ErrTooLarge, j.ID, n, MaxValueBytes)
	}
	return n, nil
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
	return decodeJob(newDecoder(bytes.Clone(data), true), j)
}

// unmarshalString decodes a value held in a string, as go-redis returns it.
// A string never changes, so the Job's strings share its memory; only the
// byte fields, which callers may modify, are copied.
func unmarshalString(s string, j *Job) error {
	return decodeJob(newDecoder(unsafe.Slice(unsafe.StringData(s), len(s)), false), j)
}

// unmarshalReply decodes a value go-redis just read off the wire into j,
// which becomes the only owner of reply's memory: its byte fields alias
// reply instead of copying it. Only for a reply string that nothing else
// holds or reads once decoded (go-redis reads each reply into a fresh
// buffer): a caller that modifies Payload or Result then modifies bytes no
// string of the Job covers, and that nothing else can see. A value written
// back from such a Job is encoded from those very bytes, unchanged.
func unmarshalReply(reply string, j *Job) error {
	return decodeJob(newDecoder(unsafe.Slice(unsafe.StringData(reply), len(reply)), true), j)
}

func decodeJob(d *msgpk.Decoder, j *Job) error { return decodeJobAs(d, j, knownFields) }

// decodeJobAs decodes as a build that knows the first known fields of the
// array would (known is v1Fields plus its minor version): the fields past
// them are kept raw in Job.future. Only tests pass less than knownFields,
// to read a value the way an older build reads it.
func decodeJobAs(d *msgpk.Decoder, j *Job, known int) error {
	*j = Job{}
	if len(d.B) > MaxValueBytes {
		return fmt.Errorf("%w: value is %d bytes, limit %d", ErrTooLarge, len(d.B), MaxValueBytes)
	}
	n, err := d.ArrayLen("value")
	if err != nil {
		return err
	}
	if n < 2 {
		return d.Corrupt("value", fmt.Sprintf("array of %d elements has no version", n))
	}
	major, err := d.Uint("format major version", math.MaxUint32)
	if err != nil {
		return err
	}
	if major != formatMajor {
		return fmt.Errorf("%w: major version %d, this build reads %d", ErrUnsupportedFormat, major, formatMajor)
	}
	minor, err := d.Uint("format minor version", math.MaxUint32)
	if err != nil {
		return err
	}
	if n < v1Fields {
		return d.Corrupt("value", fmt.Sprintf("array of %d elements, v1 needs %d", n, v1Fields))
	}
	var out Job
	if err := decodeFields(d, &out); err != nil {
		return err
	}
	// The fields of later minor versions, each read when the value has it
	// and this build knows it.
	has := func(i int) bool { return i < n && i < known }
	if has(v1Fields) { // 1.1
		if out.LeaseToken, err = d.Uint("LeaseToken", math.MaxUint64); err != nil {
			return err
		}
	}
	if has(v1Fields + 1) { // 1.2
		if out.Meta, err = decodeMeta(d, "Meta"); err != nil {
			return err
		}
	}
	if has(v1Fields + 2) { // 1.3
		ms, err := d.Int("Timeout", 0, MaxTimeout.Milliseconds())
		if err != nil {
			return err
		}
		out.Timeout = time.Duration(ms) * time.Millisecond
	}
	if has(v1Fields + 3) { // 1.4
		p, err := d.Uint("Priority", MaxPriority)
		if err != nil {
			return err
		}
		out.Priority = int(p)
	}
	if has(v1Fields + 4) { // 1.5
		if out.ConcurrencyKey, err = d.Str("ConcurrencyKey"); err != nil {
			return err
		}
		if len(out.ConcurrencyKey) > MaxConcurrencyKeyLen {
			return d.Corrupt("ConcurrencyKey", fmt.Sprintf("%d bytes, limit %d", len(out.ConcurrencyKey), MaxConcurrencyKeyLen))
		}
	}
	if has(v1Fields + 5) { // 1.6
		ms, err := d.Int("Retention", 0, MaxRetention.Milliseconds())
		if err != nil {
			return err
		}
		out.Retention = time.Duration(ms) * time.Millisecond
	}
	if has(v1Fields + 6) { // 1.6
		ms, err := d.Int("Deadline", math.MinInt64, math.MaxInt64)
		if err != nil {
			return err
		}
		out.Deadline = fromMillis(ms)
	}
	if err := decodeV17(d, &out, has); err != nil {
		return err
	}
	// Fields appended by a newer minor version are checked to be well
	// formed and kept as they are, to be written back unchanged.
	known = max(known, v1Fields)
	start := d.Off
	for i := known; i < n; i++ {
		if err := d.SkipDepth(fmt.Sprintf("appended field %d", i), 0, maxSkipDepth); err != nil {
			return err
		}
	}
	if n > known {
		out.future = futureFields{minor: minor, n: n - known, raw: d.B[start:d.Off:d.Off]}
	}
	if d.Off != len(d.B) {
		return d.Corrupt("value", fmt.Sprintf("%d trailing bytes", len(d.B)-d.Off))
	}
	*j = out
	return nil
}

// fieldReader reads a value's fields in wire order, each only while the
// ones before it read well: err is the first error, which names its field.
// The job's and the batch's decoders share it.
type fieldReader struct {
	d   *msgpk.Decoder
	err error
}

func (f *fieldReader) str(name string, dst *string) {
	if f.err == nil {
		*dst, f.err = f.d.Str(name)
	}
}

func (f *fieldReader) bin(name string, dst *[]byte) {
	if f.err == nil {
		*dst, f.err = f.d.Bin(name)
	}
}

// num reads a count: 0 to MaxAttemptsLimit.
func (f *fieldReader) num(name string, dst *int) {
	if f.err == nil {
		var v int64
		v, f.err = f.d.Int(name, 0, MaxAttemptsLimit)
		*dst = int(v)
	}
}

// tm reads a time in unix milliseconds; 0 is the zero time.
func (f *fieldReader) tm(name string, dst *time.Time) {
	if f.err == nil {
		var v int64
		v, f.err = f.d.Int(name, math.MinInt64, math.MaxInt64)
		*dst = fromMillis(v)
	}
}

// uint reads an unsigned integer of at most max.
func (f *fieldReader) uint(name string, max uint64, dst *uint64) {
	if f.err == nil {
		*dst, f.err = f.d.Uint(name, max)
	}
}

// fields decodes the v1 fields in wire order.
func decodeFields(d *msgpk.Decoder, j *Job) error {
	f := fieldReader{d: d}
	f.str("ID", &j.ID)
	f.str("Queue", &j.Queue)
	f.str("Type", &j.Type)
	f.bin("Payload", &j.Payload)
	if f.err == nil {
		at := d.Off
		var s uint64
		f.uint("State", math.MaxUint8, &s)
		j.State = State(s)
		if f.err == nil && !j.State.Valid() {
			f.err = corruptAt(at, "State", fmt.Sprintf("unknown state %d", s))
		}
	}
	f.num("Attempt", &j.Attempt)
	f.num("MaxAttempts", &j.MaxAttempts)
	f.tm("RunAt", &j.RunAt)
	f.str("LeaseOwner", &j.LeaseOwner)
	f.tm("LeaseUntil", &j.LeaseUntil)
	f.str("LastError", &j.LastError)
	f.bin("Result", &j.Result)
	f.tm("CreatedAt", &j.CreatedAt)
	f.tm("UpdatedAt", &j.UpdatedAt)
	f.uint("Rev", math.MaxUint64, &j.Rev)
	return f.err
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

// decodeV17 reads the fields 1.7 appended, each when the value has it and
// the build knows it.
func decodeV17(d *msgpk.Decoder, out *Job, has func(int) bool) error {
	if has(v1Fields + 7) {
		n, err := d.Uint("Snoozes", MaxAttemptsLimit)
		if err != nil {
			return err
		}
		out.Snoozes = int(n)
	}
	if has(v1Fields + 8) {
		ms, err := d.Int("StartedAt", math.MinInt64, math.MaxInt64)
		if err != nil {
			return err
		}
		out.StartedAt = fromMillis(ms)
	}
	if has(v1Fields + 9) {
		h, err := decodeHistory(d)
		if err != nil {
			return err
		}
		out.History = h
	}
	if has(v1Fields + 10) {
		n, err := d.Uint("HistoryDropped", MaxAttemptsLimit)
		if err != nil {
			return err
		}
		out.HistoryDropped = int(n)
	}
	if has(v1Fields + 11) {
		at := d.Off
		p, err := d.Bin("Progress")
		if err != nil {
			return err
		}
		if len(p) > MaxProgressBytes {
			return d.ErrorAt(at, "Progress", fmt.Sprintf("%d bytes, limit %d", len(p), MaxProgressBytes))
		}
		out.Progress = p
	}
	if has(v1Fields + 12) { // 1.8
		at := d.Off
		b, err := d.Str("Batch")
		if err != nil {
			return err
		}
		if b != "" && validID(b) != nil {
			return d.ErrorAt(at, "Batch", "not a valid job ID")
		}
		out.Batch = b
	}
	return nil
}
