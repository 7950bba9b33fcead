// Package msgpk reads and writes, by hand, the msgpack primitives that
// jobkey's stored values are built from: a job (the root package's codec)
// and a concurrency key's value. Reading is bounded: every length a header
// claims is checked against the bytes present before anything is
// allocated, nesting is limited, and nothing panics on any input.
package msgpk

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Decoder reads msgpack primitives from a byte slice. Every length a header
// claims is checked against the bytes that remain before anything is
// allocated, so a hostile header costs nothing.
type Decoder struct {
	B   []byte
	Off int
	// Own says B is the decoder's private copy, so byte fields may alias
	// it. Otherwise B is read-only shared memory and byte fields are copied.
	Own bool
	// Elems counts the array elements and map entries SkipDepth has
	// stepped over, so a caller can bound what decoding them would cost.
	Elems int
	// MaxLen, when not 0, bounds every length a header may claim.
	MaxLen uint64
	// NewError, when set, makes the error of a malformed value: the field,
	// the offset of the element that is wrong, and why. Else it is *Error.
	NewError func(off int, field, reason string) error
}

// Error is a malformed value, at Offset, in Field, for Reason.
type Error struct {
	Field  string
	Offset int
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("msgpack: %s at byte %d: %s", e.Field, e.Offset, e.Reason)
}

// ErrorAt returns the error of a malformed element that starts at off.
func (d *Decoder) ErrorAt(off int, field, reason string) error {
	if d.NewError != nil {
		return d.NewError(off, field, reason)
	}
	return &Error{Field: field, Offset: off, Reason: reason}
}

// Corrupt returns the error of a malformed element at the current offset.
func (d *Decoder) Corrupt(field, reason string) error { return d.ErrorAt(d.Off, field, reason) }

// Remaining is how many bytes are left to read.
func (d *Decoder) Remaining() int { return len(d.B) - d.Off }

// Need returns the next n bytes, or a truncation error.
func (d *Decoder) Need(field string, n int) ([]byte, error) {
	if n < 0 || n > d.Remaining() {
		return nil, d.Corrupt(field, fmt.Sprintf("needs %d bytes, %d remain", n, d.Remaining()))
	}
	p := d.B[d.Off : d.Off+n]
	d.Off += n
	return p, nil
}

// Code reads one type code.
func (d *Decoder) Code(field string) (byte, error) {
	p, err := d.Need(field, 1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// Sized reads a big-endian length or number of width 1, 2, 4 or 8 bytes.
func (d *Decoder) Sized(field string, width int) (uint64, error) {
	p, err := d.Need(field, width)
	if err != nil {
		return 0, err
	}
	switch width {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// Length checks a claimed length against what remains (each element or byte
// needs at least minEach bytes) and against MaxLen.
func (d *Decoder) Length(field string, at int, n uint64, minEach int) (int, error) {
	if d.MaxLen > 0 && n > d.MaxLen || int(n)*minEach > d.Remaining() {
		return 0, d.ErrorAt(at, field, fmt.Sprintf("header claims %d, only %d bytes remain", n, d.Remaining()))
	}
	return int(n), nil
}

// ArrayLen reads an array header, its length checked against what remains.
func (d *Decoder) ArrayLen(field string) (int, error) {
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedArray(c):
		n = uint64(c & msgpcode.FixedArrayMask)
	case c == msgpcode.Array16:
		n, err = d.Sized(field, 2)
	case c == msgpcode.Array32:
		n, err = d.Sized(field, 4)
	default:
		return 0, d.ErrorAt(at, field, fmt.Sprintf("want array, found code 0x%02x", c))
	}
	if err != nil {
		return 0, err
	}
	return d.Length(field, at, n, 1)
}

// RawInt reads any msgpack integer encoding. neg reports a negative value,
// in which case v holds it as int64 bits.
func (d *Decoder) RawInt(field string) (v uint64, neg bool, err error) {
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, nil
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, nil
	}
	var w int
	signed := false
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		w = 1 << (c - msgpcode.Uint8)
	case msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		w = 1 << (c - msgpcode.Int8)
		signed = true
	default:
		return 0, false, d.ErrorAt(at, field, fmt.Sprintf("want integer, found code 0x%02x", c))
	}
	u, err := d.Sized(field, w)
	if err != nil || !signed {
		return u, false, err
	}
	// Sign-extend from the encoded width.
	shift := 64 - 8*w
	s := int64(u<<shift) >> shift
	return uint64(s), s < 0, nil
}

// Uint reads an integer of any encoding, refused outside [0, max].
func (d *Decoder) Uint(field string, max uint64) (uint64, error) {
	at := d.Off
	v, neg, err := d.RawInt(field)
	if err != nil {
		return 0, err
	}
	if neg || v > max {
		return 0, d.ErrorAt(at, field, fmt.Sprintf("value %d out of range [0, %d]", int64(v), max))
	}
	return v, nil
}

// Int reads an integer of any encoding, refused outside [lo, hi].
func (d *Decoder) Int(field string, lo, hi int64) (int64, error) {
	at := d.Off
	v, neg, err := d.RawInt(field)
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, d.ErrorAt(at, field, fmt.Sprintf("value %d overflows int64", v))
	}
	s := int64(v)
	if s < lo || s > hi {
		return 0, d.ErrorAt(at, field, fmt.Sprintf("value %d out of range [%d, %d]", s, lo, hi))
	}
	return s, nil
}

// StrBytes reads a string as the slice of B that holds it.
func (d *Decoder) StrBytes(field string) ([]byte, error) {
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedString(c):
		n = uint64(c & msgpcode.FixedStrMask)
	case c == msgpcode.Str8:
		n, err = d.Sized(field, 1)
	case c == msgpcode.Str16:
		n, err = d.Sized(field, 2)
	case c == msgpcode.Str32:
		n, err = d.Sized(field, 4)
	default:
		return nil, d.ErrorAt(at, field, fmt.Sprintf("want string, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	ln, err := d.Length(field, at, n, 1)
	if err != nil {
		return nil, err
	}
	return d.Need(field, ln)
}

// Str returns a string sharing d.B's memory. d.B is either the decoder's
// own copy of the value, which nothing else can reach, or a string's bytes;
// either way it is never modified, so the strings stay immutable as Go
// requires.
func (d *Decoder) Str(field string) (string, error) {
	p, err := d.StrBytes(field)
	if err != nil || len(p) == 0 {
		return "", err
	}
	return unsafe.String(&p[0], len(p)), nil
}

// Bin returns a slice of d.B capped at its length (appending to it
// reallocates instead of overwriting the next field) when d owns d.B, and
// a copy otherwise. An empty bin decodes to nil.
func (d *Decoder) Bin(field string) ([]byte, error) {
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case msgpcode.Bin8:
		n, err = d.Sized(field, 1)
	case msgpcode.Bin16:
		n, err = d.Sized(field, 2)
	case msgpcode.Bin32:
		n, err = d.Sized(field, 4)
	default:
		return nil, d.ErrorAt(at, field, fmt.Sprintf("want bin, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	ln, err := d.Length(field, at, n, 1)
	if err != nil {
		return nil, err
	}
	p, err := d.Need(field, ln)
	if err != nil || ln == 0 {
		return nil, err
	}
	if !d.Own {
		return bytes.Clone(p), nil
	}
	return p[:ln:ln], nil
}

// SkipDepth steps over one value of any type without allocating, for
// fields a newer minor version appended; depth is the nesting so far, and
// more than limit is refused.
func (d *Decoder) SkipDepth(field string, depth, limit int) error {
	if depth > limit {
		return d.Corrupt(field, "nested too deeply")
	}
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return err
	}
	skipN := func(width int, each uint64) error { // read a length, skip that many bytes
		n, err := d.Sized(field, width)
		if err != nil {
			return err
		}
		ln, err := d.Length(field, at, n, 1)
		if err != nil {
			return err
		}
		_, err = d.Need(field, ln+int(each))
		return err
	}
	elems := func(n uint64, per int) error { // skip n (or n pairs of) values
		ln, err := d.Length(field, at, n, per)
		if err != nil {
			return err
		}
		d.Elems += ln
		for i := 0; i < ln*per; i++ {
			if err := d.SkipDepth(field, depth+1, limit); err != nil {
				return err
			}
		}
		return nil
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh, c >= msgpcode.NegFixedNumLow,
		c == msgpcode.Nil, c == msgpcode.True, c == msgpcode.False:
		return nil
	case msgpcode.IsFixedString(c):
		_, err = d.Need(field, int(c&msgpcode.FixedStrMask))
		return err
	case msgpcode.IsFixedArray(c):
		return elems(uint64(c&msgpcode.FixedArrayMask), 1)
	case msgpcode.IsFixedMap(c):
		return elems(uint64(c&msgpcode.FixedMapMask), 2)
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		_, err = d.Need(field, 1)
	case msgpcode.Uint16, msgpcode.Int16:
		_, err = d.Need(field, 2)
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		_, err = d.Need(field, 4)
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		_, err = d.Need(field, 8)
	case msgpcode.Str8, msgpcode.Bin8:
		err = skipN(1, 0)
	case msgpcode.Str16, msgpcode.Bin16:
		err = skipN(2, 0)
	case msgpcode.Str32, msgpcode.Bin32:
		err = skipN(4, 0)
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		_, err = d.Need(field, 1+(1<<(c-msgpcode.FixExt1)))
	case msgpcode.Ext8:
		err = skipN(1, 1)
	case msgpcode.Ext16:
		err = skipN(2, 1)
	case msgpcode.Ext32:
		err = skipN(4, 1)
	case msgpcode.Array16, msgpcode.Array32, msgpcode.Map16, msgpcode.Map32:
		w, per := 2, 1
		if c == msgpcode.Array32 || c == msgpcode.Map32 {
			w = 4
		}
		if c == msgpcode.Map16 || c == msgpcode.Map32 {
			per = 2
		}
		n, err := d.Sized(field, w)
		if err != nil {
			return err
		}
		return elems(n, per)
	default:
		return d.ErrorAt(at, field, fmt.Sprintf("unknown code 0x%02x", c))
	}
	return err
}
