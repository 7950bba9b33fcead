package jobkey

import (
	"fmt"

	"github.com/jobkey/jobkey/internal/msgpk"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// newDecoder is a bounded msgpack decoder of b (internal/msgpk) whose
// errors are *CorruptError. own says b is a private copy that decoded
// fields may alias.
func newDecoder(b []byte, own bool) *msgpk.Decoder {
	return &msgpk.Decoder{B: b, Own: own, MaxLen: MaxValueBytes, NewError: corruptAt}
}

func corruptAt(off int, field, reason string) error {
	return &CorruptError{Field: field, Offset: off, Reason: reason}
}

// decodeMeta reads Job.Meta: a map of at most MaxMetaEntries strings to strings,
// with non-empty, distinct keys and at most MaxMetaBytes of keys and values
// together. The entry count is checked before the map is allocated; an
// empty map decodes to nil.
func decodeMeta(d *msgpk.Decoder, field string) (map[string]string, error) {
	at := d.Off
	c, err := d.Code(field)
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case msgpcode.IsFixedMap(c):
		n = uint64(c & msgpcode.FixedMapMask)
	case c == msgpcode.Map16:
		n, err = d.Sized(field, 2)
	case c == msgpcode.Map32:
		n, err = d.Sized(field, 4)
	default:
		return nil, corruptAt(at, field, fmt.Sprintf("want map, found code 0x%02x", c))
	}
	if err != nil {
		return nil, err
	}
	if n > MaxMetaEntries {
		return nil, corruptAt(at, field, fmt.Sprintf("%d entries, limit %d", n, MaxMetaEntries))
	}
	ln, err := d.Length(field, at, n, 2) // each entry is two strings, a byte each at least
	if err != nil || ln == 0 {
		return nil, err
	}
	m := make(map[string]string, ln)
	size := 0
	for range ln {
		kat := d.Off
		k, err := d.Str(field + " key")
		if err != nil {
			return nil, err
		}
		v, err := d.Str(field + " value")
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
