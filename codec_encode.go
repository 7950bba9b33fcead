package jobkey

import (
	"encoding/binary"
	"maps"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// encodedSize is the exact length appendJob produces, so Marshal allocates
// once and oversized jobs are refused before any encoding work.
func encodedSize(j *Job) int { return encodedSizeAs(j, knownFields) }

// encodedSizeAs is encodedSize for a build that knows the first known
// fields (see decodeJobAs).
func encodedSizeAs(j *Job, known int) int {
	n := arrayHdrSize(known+j.future.n) +
		uintSize(formatMajor) + uintSize(j.minorAs(known)) +
		strSize(j.ID) + strSize(j.Queue) + strSize(j.Type) + binSize(len(j.Payload)) +
		uintSize(uint64(j.State)) + intSize(int64(j.Attempt)) + intSize(int64(j.MaxAttempts)) +
		intSize(toMillis(j.RunAt)) + strSize(j.LeaseOwner) + intSize(toMillis(j.LeaseUntil)) +
		strSize(j.LastError) + binSize(len(j.Result)) +
		intSize(toMillis(j.CreatedAt)) + intSize(toMillis(j.UpdatedAt)) + uintSize(j.Rev) +
		uintSize(j.LeaseToken) + len(j.future.raw)
	if known > v1Fields+1 {
		n += metaSize(j.Meta)
	}
	if known > v1Fields+2 {
		n += intSize(j.Timeout.Milliseconds())
	}
	if known > v1Fields+3 {
		n += uintSize(uint64(j.Priority))
	}
	if known > v1Fields+4 {
		n += strSize(j.ConcurrencyKey)
	}
	if known > v1Fields+5 {
		n += intSize(j.Retention.Milliseconds())
	}
	if known > v1Fields+6 {
		n += intSize(toMillis(j.Deadline))
	}
	return n
}

// appendJob writes the v1 array. The field order is the wire format: new
// fields may only be appended, in a new minor version.
func appendJob(b []byte, j *Job) []byte { return appendJobAs(b, j, knownFields) }

// appendJobAs writes j as a build that knows the first known fields would
// (see decodeJobAs): an older build writes the fields it knows, then the
// ones it kept raw.
func appendJobAs(b []byte, j *Job, known int) []byte {
	b = appendArrayHdr(b, known+j.future.n)
	b = appendUint(b, formatMajor)
	b = appendUint(b, j.minorAs(known))
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
	if known > v1Fields+1 {
		b = appendMeta(b, j.Meta) // 1.2
	}
	if known > v1Fields+2 {
		b = appendInt(b, j.Timeout.Milliseconds()) // 1.3
	}
	if known > v1Fields+3 {
		b = appendUint(b, uint64(j.Priority)) // 1.4
	}
	if known > v1Fields+4 {
		b = appendStr(b, j.ConcurrencyKey) // 1.5
	}
	if known > v1Fields+5 {
		b = appendInt(b, j.Retention.Milliseconds()) // 1.6
	}
	if known > v1Fields+6 {
		b = appendInt(b, toMillis(j.Deadline)) // 1.6
	}
	return append(b, j.future.raw...)
}

// metaSize is the length appendMeta produces.
func metaSize(m map[string]string) int {
	n := mapHdrSize(len(m))
	for k, v := range m {
		n += strSize(k) + strSize(v)
	}
	return n
}

// appendMeta writes m as a msgpack map of strings, keys in byte order so a
// job always encodes to the same bytes. An empty or nil map is one byte.
func appendMeta(b []byte, m map[string]string) []byte {
	b = appendMapHdr(b, len(m))
	if len(m) == 0 {
		return b
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = appendStr(appendStr(b, k), m[k])
	}
	return b
}

func mapHdrSize(n int) int { return arrayHdrSize(n) } // same widths as arrays

func appendMapHdr(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, msgpcode.FixedMapLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Map16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Map32), uint32(n))
}

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
