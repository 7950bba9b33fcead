package jobkey

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/jobkey/jobkey/internal/msgpk"
)

// The stored value of a batch: one msgpack array under the batch's key,
// written whole, as a job's is. Its format has versions of its own, apart
// from the job value's:
//
//	1.0  16 elements: the versions; ID, Queue; Total, Pending, Succeeded,
//	     Failed, Canceled; Condition, Fired; FiredAt, CreatedAt (unix ms,
//	     0: none); After (a string, "": none); Rev; and the callback, a
//	     bin holding a whole job value (codec.go) with the batch's ID
//
// As for a job, a minor version may only append fields: a build reads the
// ones it knows and writes the others back as they were read.
const (
	batchFormatMajor = 1
	batchFormatMinor = 0
	batchFields      = 16
)

// encodeBatch returns b's value.
func encodeBatch(b *Batch) ([]byte, error) {
	if b.Callback == nil {
		return nil, fmt.Errorf("jobkey: internal error: batch %q has no callback", b.ID)
	}
	cb, err := Marshal(b.Callback)
	if err != nil {
		return nil, fmt.Errorf("batch %q: %w", b.ID, err)
	}
	out := msgpk.AppendArrayHdr(nil, batchFields+b.future.n)
	out = msgpk.AppendUint(out, batchFormatMajor)
	out = msgpk.AppendUint(out, max(batchFormatMinor, b.future.minor))
	out = msgpk.AppendStr(out, b.ID)
	out = msgpk.AppendStr(out, b.Queue)
	for _, n := range []int{b.Total, b.Pending, b.Succeeded, b.Failed, b.Canceled} {
		out = msgpk.AppendInt(out, int64(n))
	}
	out = msgpk.AppendUint(out, uint64(b.Condition))
	out = msgpk.AppendUint(out, uint64(b.Fired))
	out = msgpk.AppendInt(out, toMillis(b.FiredAt))
	out = msgpk.AppendInt(out, toMillis(b.CreatedAt))
	out = msgpk.AppendStr(out, b.After)
	out = msgpk.AppendUint(out, b.Rev)
	out = msgpk.AppendBin(out, cb)
	return append(out, b.future.raw...), nil
}

// decodeBatch reads a batch's value. Like the job codec, it never panics
// and never trusts a length: malformed input is ErrCorrupt, naming the
// field and offset, and an unknown major version is ErrUnsupportedFormat.
func decodeBatch(s string) (*Batch, error) {
	if len(s) > MaxValueBytes {
		return nil, fmt.Errorf("%w: batch value is %d bytes, limit %d", ErrTooLarge, len(s), MaxValueBytes)
	}
	d := newDecoder(unsafe.Slice(unsafe.StringData(s), len(s)), false)
	n, err := d.ArrayLen("batch value")
	if err != nil {
		return nil, err
	}
	if n < 2 {
		return nil, d.Corrupt("batch value", fmt.Sprintf("array of %d elements has no version", n))
	}
	major, err := d.Uint("batch format major version", math.MaxUint32)
	if err != nil {
		return nil, err
	}
	if major != batchFormatMajor {
		return nil, fmt.Errorf("%w: batch value major version %d, this build reads %d", ErrUnsupportedFormat, major, batchFormatMajor)
	}
	minor, err := d.Uint("batch format minor version", math.MaxUint32)
	if err != nil {
		return nil, err
	}
	if n < batchFields {
		return nil, d.Corrupt("batch value", fmt.Sprintf("array of %d elements, want %d", n, batchFields))
	}
	b := &Batch{}
	f := fieldReader{d: d}
	f.str("ID", &b.ID)
	f.str("Queue", &b.Queue)
	f.num("Total", &b.Total)
	f.num("Pending", &b.Pending)
	f.num("Succeeded", &b.Succeeded)
	f.num("Failed", &b.Failed)
	f.num("Canceled", &b.Canceled)
	var c, fired uint64
	f.uint("Condition", uint64(BatchAllSucceeded), &c)
	f.uint("Fired", uint64(BatchFiredTaken), &fired)
	b.Condition, b.Fired = BatchCondition(c), BatchFired(fired)
	f.tm("FiredAt", &b.FiredAt)
	f.tm("CreatedAt", &b.CreatedAt)
	f.str("After", &b.After)
	f.uint("Rev", math.MaxUint64, &b.Rev)
	if f.err != nil {
		return nil, f.err
	}
	at := d.Off
	cb, err := d.Bin("Callback")
	if err != nil {
		return nil, err
	}
	b.Callback = &Job{}
	if err := Unmarshal(cb, b.Callback); err != nil {
		return nil, d.ErrorAt(at, "Callback", err.Error())
	}
	start := d.Off
	for i := batchFields; i < n; i++ {
		if err := d.SkipDepth(fmt.Sprintf("appended field %d", i), 0, maxSkipDepth); err != nil {
			return nil, err
		}
	}
	if n > batchFields {
		b.future = futureFields{minor: minor, n: n - batchFields, raw: []byte(string(d.B[start:d.Off]))}
	}
	if d.Off != len(d.B) {
		return nil, d.Corrupt("batch value", fmt.Sprintf("%d trailing bytes", len(d.B)-d.Off))
	}
	if b.Callback.ID != b.ID {
		return nil, d.ErrorAt(at, "Callback", fmt.Sprintf("callback ID %q is not the batch's", b.Callback.ID))
	}
	return b, nil
}
