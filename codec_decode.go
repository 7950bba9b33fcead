package jobkey

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// decoder reads msgpack primitives from a byte slice. Every length a header
// claims is checked against the bytes that remain before anything is
// allocated, so a hostile header costs nothing.
type decoder struct {
	b   []byte
	off int
	// own says b is the decoder's private copy, so byte fields may alias
	// it. Otherwise b is read-only shared memory and byte fields are copied.
	own bool
	// elems counts the array elements and map entries skipDepth has
	// stepped over, so DecodeArgs can bound what decoding them would cost.
	elems int
}

func corruptAt(off int, field, reason string) error {
	return &CorruptError{Field: field, Offset: off, Reason: reason}
}

func (d *decoder) corrupt(field, reason string) error { return corruptAt(d.off, field, reason) }

func (d *decoder) remaining() int { return len(d.b) - d.off }

// need returns the next n bytes, or a truncation error.
func (d *decoder) need(field string, n int) ([]byte, error) {
	if n < 0 || n > d.remaining() {
		return nil, d.corrupt(field, fmt.Sprintf("needs %d bytes, %d remain", n, d.remaining()))
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) code(field string) (byte, error) {
	p, err := d.need(field, 1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// sized reads a big-endian length or number of width 1, 2, 4 or 8 bytes.
func (d *decoder) sized(field string, width int) (uint64, error) {
	p, err := d.need(field, width)
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

// length checks a claimed length against what remains (each element or byte
// needs at least minEach bytes) and against MaxValueBytes.
func (d *decoder) length(field string, at int, n uint64, minEach int) (int, error) {
	if n > MaxValueBytes || int(n)*minEach > d.remaining() {
		return 0, corruptAt(at, field, fmt.Sprintf("header claims %d, only %d bytes remain", n, d.remaining()))
	}
	return int(n), nil
}

func (d *decoder) arrayLen(field string) (int, error) {
	at := d.off
	c, err := d.code(field)
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedArray(c):
		n = uint64(c & msgpcode.FixedArrayMask)
	case c == msgpcode.Array16:
		n, err = d.sized(field, 2)
	case c == msgpcode.Array32:
		n, err = d.sized(field, 4)
	default:
		return 0, corruptAt(at, field, fmt.Sprintf("want array, found code 0x%02x", c))
	}
	if err != nil {
		return 0, err
	}
	return d.length(field, at, n, 1)
}

// rawInt reads any msgpack integer encoding. neg reports a negative value,
// in which case v holds it as int64 bits.
func (d *decoder) rawInt(field string) (v uint64, neg bool, err error) {
	at := d.off
	c, err := d.code(field)
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
		return 0, false, corruptAt(at, field, fmt.Sprintf("want integer, found code 0x%02x", c))
	}
	u, err := d.sized(field, w)
	if err != nil || !signed {
		return u, false, err
	}
	// Sign-extend from the encoded width.
	shift := 64 - 8*w
	s := int64(u<<shift) >> shift
	return uint64(s), s < 0, nil
}

func (d *decoder) uint(field string, max uint64) (uint64, error) {
	at := d.off
	v, neg, err := d.rawInt(field)
	if err != nil {
		return 0, err
	}
	if neg || v > max {
		return 0, corruptAt(at, field, fmt.Sprintf("value %d out of range [0, %d]", int64(v), max))
	}
	return v, nil
}

func (d *decoder) int(field string, lo, hi int64) (int64, error) {
	at := d.off
	v, neg, err := d.rawInt(field)
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, corruptAt(at, field, fmt.Sprintf("value %d overflows int64", v))
	}
	s := int64(v)
	if s < lo || s > hi {
		return 0, corruptAt(at, field, fmt.Sprintf("value %d out of range [%d, %d]", s, lo, hi))
	}
	return s, nil
}

func (d *decoder) strBytes(field string) ([]byte, error) {
	at := d.off
	c, err := d.code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedString(c):
		n = uint64(c & msgpcode.FixedStrMask)
	case c == msgpcode.Str8:
		n, err = d.sized(field, 1)
	case c == msgpcode.Str16:
		n, err = d.sized(field, 2)
	case c == msgpcode.Str32:
		n, err = d.sized(field, 4)
	default:
		return nil, corruptAt(at, field, fmt.Sprintf("want string, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	ln, err := d.length(field, at, n, 1)
	if err != nil {
		return nil, err
	}
	return d.need(field, ln)
}

// str returns a string sharing d.b's memory. d.b is either the decoder's
// own copy of the value, which nothing else can reach, or a string's bytes;
// either way it is never modified, so the strings stay immutable as Go
// requires.
func (d *decoder) str(field string) (string, error) {
	p, err := d.strBytes(field)
	if err != nil || len(p) == 0 {
		return "", err
	}
	return unsafe.String(&p[0], len(p)), nil
}

// bin returns a slice of d.b capped at its length (appending to it
// reallocates instead of overwriting the next field) when d owns d.b, and
// a copy otherwise. An empty bin decodes to nil.
func (d *decoder) bin(field string) ([]byte, error) {
	at := d.off
	c, err := d.code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case msgpcode.Bin8:
		n, err = d.sized(field, 1)
	case msgpcode.Bin16:
		n, err = d.sized(field, 2)
	case msgpcode.Bin32:
		n, err = d.sized(field, 4)
	default:
		return nil, corruptAt(at, field, fmt.Sprintf("want bin, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	ln, err := d.length(field, at, n, 1)
	if err != nil {
		return nil, err
	}
	p, err := d.need(field, ln)
	if err != nil || ln == 0 {
		return nil, err
	}
	if !d.own {
		return bytes.Clone(p), nil
	}
	return p[:ln:ln], nil
}

// skip steps over one value of any type without allocating, for fields a
// newer minor version appended. Nesting is bounded by maxSkipDepth.
func (d *decoder) skip(field string, depth int) error { return d.skipDepth(field, depth, maxSkipDepth) }

// skipDepth is skip with a nesting limit of the caller's choice.
func (d *decoder) skipDepth(field string, depth, limit int) error {
	if depth > limit {
		return d.corrupt(field, "nested too deeply")
	}
	at := d.off
	c, err := d.code(field)
	if err != nil {
		return err
	}
	skipN := func(width int, each uint64) error { // read a length, skip that many bytes
		n, err := d.sized(field, width)
		if err != nil {
			return err
		}
		ln, err := d.length(field, at, n, 1)
		if err != nil {
			return err
		}
		_, err = d.need(field, ln+int(each))
		return err
	}
	elems := func(n uint64, per int) error { // skip n (or n pairs of) values
		ln, err := d.length(field, at, n, per)
		if err != nil {
			return err
		}
		d.elems += ln
		for i := 0; i < ln*per; i++ {
			if err := d.skipDepth(field, depth+1, limit); err != nil {
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
		_, err = d.need(field, int(c&msgpcode.FixedStrMask))
		return err
	case msgpcode.IsFixedArray(c):
		return elems(uint64(c&msgpcode.FixedArrayMask), 1)
	case msgpcode.IsFixedMap(c):
		return elems(uint64(c&msgpcode.FixedMapMask), 2)
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		_, err = d.need(field, 1)
	case msgpcode.Uint16, msgpcode.Int16:
		_, err = d.need(field, 2)
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		_, err = d.need(field, 4)
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		_, err = d.need(field, 8)
	case msgpcode.Str8, msgpcode.Bin8:
		err = skipN(1, 0)
	case msgpcode.Str16, msgpcode.Bin16:
		err = skipN(2, 0)
	case msgpcode.Str32, msgpcode.Bin32:
		err = skipN(4, 0)
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		_, err = d.need(field, 1+(1<<(c-msgpcode.FixExt1)))
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
		n, err := d.sized(field, w)
		if err != nil {
			return err
		}
		return elems(n, per)
	default:
		return corruptAt(at, field, fmt.Sprintf("unknown code 0x%02x", c))
	}
	return err
}

// meta reads Job.Meta: a map of at most MaxMetaEntries strings to strings,
// with non-empty, distinct keys and at most MaxMetaBytes of keys and values
// together. The entry count is checked before the map is allocated; an
// empty map decodes to nil.
func (d *decoder) meta(field string) (map[string]string, error) {
	at := d.off
	c, err := d.code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedMap(c):
		n = uint64(c & msgpcode.FixedMapMask)
	case c == msgpcode.Map16:
		n, err = d.sized(field, 2)
	case c == msgpcode.Map32:
		n, err = d.sized(field, 4)
	default:
		return nil, corruptAt(at, field, fmt.Sprintf("want map, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	if n > MaxMetaEntries {
		return nil, corruptAt(at, field, fmt.Sprintf("%d entries, limit %d", n, MaxMetaEntries))
	}
	ln, err := d.length(field, at, n, 2) // each entry is two strings, a byte each at least
	if err != nil || ln == 0 {
		return nil, err
	}
	m := make(map[string]string, ln)
	size := 0
	for range ln {
		kat := d.off
		k, err := d.str(field + " key")
		if err != nil {
			return nil, err
		}
		v, err := d.str(field + " value")
		if err != nil {
			return nil, err
		}
		switch _, dup := m[k]; {
		case k == "":
			return nil, corruptAt(kat, field, "empty key")
		case dup:
			return nil, corruptAt(kat, field, fmt.Sprintf("key %q appears twice", k))
		}
		if size += len(k) + len(v); size > MaxMetaBytes {
			return nil, corruptAt(kat, field, fmt.Sprintf("keys and values exceed %d bytes", MaxMetaBytes))
		}
		m[k] = v
	}
	return m, nil
}
