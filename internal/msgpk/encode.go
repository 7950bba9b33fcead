package msgpk

import (
	"encoding/binary"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MapHdrSize is the size of the header of a map of n entries.
func MapHdrSize(n int) int { return ArrayHdrSize(n) } // same widths as arrays

// AppendMapHdr appends the header of a map of n entries, in its smallest form.
func AppendMapHdr(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, msgpcode.FixedMapLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Map16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Map32), uint32(n))
}

// ArrayHdrSize is the size of the header of an array of n elements.
func ArrayHdrSize(n int) int {
	switch {
	case n <= 15:
		return 1
	case n <= math.MaxUint16:
		return 3
	}
	return 5
}

// AppendArrayHdr appends the header of an array of n elements, in its smallest form.
func AppendArrayHdr(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, msgpcode.FixedArrayLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Array16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Array32), uint32(n))
}

// UintSize is the size of v as AppendUint writes it.
func UintSize(v uint64) int {
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

// AppendUint appends v in its smallest encoding.
func AppendUint(b []byte, v uint64) []byte {
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

// IntSize is the size of v as AppendInt writes it.
func IntSize(v int64) int {
	switch {
	case v >= 0:
		return UintSize(uint64(v))
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

// AppendInt appends v in its smallest encoding.
func AppendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(b, uint64(v))
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

// StrSize is the size of s as AppendStr writes it.
func StrSize(s string) int {
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

// AppendStr appends s as a msgpack string.
func AppendStr(b []byte, s string) []byte {
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

// BinSize is the size of a bin of n bytes as AppendBin writes it.
func BinSize(n int) int {
	switch {
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	}
	return 5 + n
}

// AppendBin appends p as a msgpack bin.
func AppendBin(b []byte, p []byte) []byte {
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
