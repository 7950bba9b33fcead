package msgpk

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// Every primitive is written at the size its Size function says, reads back
// as written, and decodes with msgpack's own decoder to the same value.
func TestPrimitivesRoundTripAtTheirSize(t *testing.T) {
	t.Parallel()
	for _, v := range []int64{0, 1, 127, 128, 255, 256, -1, -32, -33, -128, -129, math.MaxInt16, math.MinInt16, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64} {
		b := AppendInt(nil, v)
		require.Len(t, b, IntSize(v), "%d", v)
		d := &Decoder{B: b}
		got, err := d.Int("v", math.MinInt64, math.MaxInt64)
		require.NoError(t, err)
		require.Equal(t, v, got)
		var ref int64
		require.NoError(t, msgpack.Unmarshal(b, &ref))
		require.Equal(t, v, ref)
	}
	for _, v := range []uint64{0, 127, 128, 255, 256, math.MaxUint16, math.MaxUint16 + 1, math.MaxUint32, math.MaxUint32 + 1, math.MaxUint64} {
		b := AppendUint(nil, v)
		require.Len(t, b, UintSize(v), "%d", v)
		got, err := (&Decoder{B: b}).Uint("v", math.MaxUint64)
		require.NoError(t, err)
		require.Equal(t, v, got)
	}
	for _, n := range []int{0, 1, 31, 32, 255, 256, math.MaxUint16 + 1} {
		s := strings.Repeat("x", n)
		b := AppendStr(nil, s)
		require.Len(t, b, StrSize(s))
		got, err := (&Decoder{B: b}).Str("s")
		require.NoError(t, err)
		require.Equal(t, s, got)

		p := []byte(s)
		b = AppendBin(nil, p)
		require.Len(t, b, BinSize(n))
		bin, err := (&Decoder{B: b}).Bin("p")
		require.NoError(t, err)
		if n == 0 {
			require.Nil(t, bin, "an empty bin decodes to nil")
		} else {
			require.Equal(t, p, bin)
		}
	}
	for _, n := range []int{0, 15, 16, math.MaxUint16, math.MaxUint16 + 1} {
		require.Len(t, AppendArrayHdr(nil, n), ArrayHdrSize(n))
		require.Len(t, AppendMapHdr(nil, n), MapHdrSize(n))
	}
}

// A header that claims more than the bytes present, or more than MaxLen,
// is refused before anything is allocated, with the offset of the element.
func TestHostileLengthsAreRefused(t *testing.T) {
	t.Parallel()
	str32 := []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'} // claims 4 GiB
	_, err := (&Decoder{B: str32}).Str("s")
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, Error{Field: "s", Offset: 0, Reason: "header claims 4294967295, only 1 bytes remain"}, *e)

	arr := AppendArrayHdr(nil, 3)
	arr = append(arr, 1, 2, 3)
	_, err = (&Decoder{B: arr, MaxLen: 2}).ArrayLen("a")
	require.ErrorAs(t, err, &e)

	_, err = (&Decoder{B: []byte{0xcc}}).Uint("u", 255) // uint8 without its byte
	require.ErrorAs(t, err, &e)
	require.Equal(t, 1, e.Offset)
}

func TestIntegersOutOfRangeAreRefused(t *testing.T) {
	t.Parallel()
	_, err := (&Decoder{B: AppendInt(nil, -1)}).Uint("u", 10)
	require.Error(t, err)
	_, err = (&Decoder{B: AppendUint(nil, 11)}).Uint("u", 10)
	require.Error(t, err)
	_, err = (&Decoder{B: AppendUint(nil, math.MaxUint64)}).Int("i", math.MinInt64, math.MaxInt64)
	require.ErrorContains(t, err, "overflows int64")
}

// SkipDepth steps over nested values, counting their elements, and refuses
// nesting past its limit.
func TestSkipDepthBoundsNesting(t *testing.T) {
	t.Parallel()
	b, err := msgpack.Marshal(map[string]any{"a": []any{1, "x", []byte("y"), map[string]int{"z": 2}}})
	require.NoError(t, err)
	d := &Decoder{B: b}
	require.NoError(t, d.SkipDepth("v", 0, 4))
	require.Zero(t, d.Remaining())
	require.Equal(t, 6, d.Elems, "one map entry, four array elements, one inner entry")

	deep := []byte{}
	for range 10 {
		deep = AppendArrayHdr(deep, 1)
	}
	deep = append(deep, 0)
	require.Error(t, (&Decoder{B: deep}).SkipDepth("v", 0, 5))
	require.NoError(t, (&Decoder{B: deep}).SkipDepth("v", 0, 10))
}

func TestNewErrorMakesTheCallersError(t *testing.T) {
	t.Parallel()
	mine := errors.New("mine")
	d := &Decoder{B: nil, NewError: func(int, string, string) error { return mine }}
	_, err := d.Code("c")
	require.ErrorIs(t, err, mine)
}

// No input panics, and a value that decodes was not read past its end.
func FuzzDecoderNeverPanics(f *testing.F) {
	f.Add([]byte{0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Add(AppendArrayHdr(AppendStr(nil, "x"), 2))
	f.Fuzz(func(t *testing.T, b []byte) {
		d := &Decoder{B: b, MaxLen: 1 << 20}
		if d.SkipDepth("v", 0, 16) == nil {
			require.LessOrEqual(t, d.Off, len(b))
		}
		d = &Decoder{B: b}
		_, _ = d.Str("s")
		_, _ = (&Decoder{B: b}).Bin("b")
		_, _ = (&Decoder{B: b}).Int("i", math.MinInt64, math.MaxInt64)
		_, _ = (&Decoder{B: b}).ArrayLen("a")
	})
}
