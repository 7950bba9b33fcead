package resp

import (
	"errors"
	"math/big"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Every reply type of RESP2 and RESP3 reads as go-redis's Cmd.Val gives
// it, and the bytes after it are left.
func TestNextReadsEveryReplyType(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want any
	}{
		{"+OK\r\n", "OK"},
		{"+QUEUED\r\n", "QUEUED"},
		{"+PONG\r\n", "PONG"},
		{"-ERR wrong\r\n", Error("ERR wrong")},
		{":42\r\n", int64(42)},
		{":-7\r\n", int64(-7)},
		{"$3\r\nabc\r\n", "abc"},
		{"$0\r\n\r\n", ""},
		{"$4\r\na\r\nb\r\n", "a\r\nb"},
		{"$-1\r\n", nil},
		{"*-1\r\n", nil},
		{"_\r\n", nil},
		{",1.5\r\n", 1.5},
		{"#t\r\n", true},
		{"#f\r\n", false},
		{"(12345678901234567890\r\n", func() any { n, _ := new(big.Int).SetString("12345678901234567890", 10); return n }()},
		{"!5\r\nERR x\r\n", Error("ERR x")},
		{"=7\r\ntxt:abc\r\n", "abc"},
		{"*3\r\n:1\r\n$1\r\na\r\n*1\r\n+OK\r\n", []any{int64(1), "a", []any{"OK"}}},
		{"~1\r\n:1\r\n", []any{int64(1)}},
		{"%1\r\n$1\r\nk\r\n:2\r\n", map[any]any{"k": int64(2)}},
		{"|1\r\n+key\r\n+val\r\n:3\r\n", int64(3)},
	} {
		v, rest, err := Next([]byte(tc.raw + "+next\r\n"))
		require.NoError(t, err, tc.raw)
		require.Equal(t, tc.want, v, tc.raw)
		require.Equal(t, "+next\r\n", string(rest), tc.raw)
	}
}

// Bytes that are not one whole reply are ErrMalformed, never a panic and
// never a value.
func TestNextRefusesMalformedReplies(t *testing.T) {
	for _, raw := range []string{
		"", "+OK", "+OK\n", "\r\n", "?x\r\n", ":x\r\n", "$5\r\nab\r\n", "$3\r\nabcde", "$-2\r\n",
		"*2\r\n:1\r\n", "*99999999999\r\n", "%1\r\n*1\r\n:1\r\n:2\r\n", "#x\r\n", ",x\r\n", "(x\r\n",
		"=2\r\nab\r\n", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
	} {
		v, _, err := Next([]byte(raw))
		require.ErrorIs(t, err, ErrMalformed, "%q", raw)
		require.Nil(t, v, "%q", raw)
	}
}

// An error reply is a redis.Error to go-redis's helpers, so the engine
// tells it from a network error as it does go-redis's own.
func TestErrorIsARedisError(t *testing.T) {
	var err error = Error("EXECABORT Transaction discarded because of previous errors.")
	var rerr redis.Error
	require.True(t, errors.As(err, &rerr))
	require.True(t, redis.IsExecAbortError(err))
}

// Header reads an array's length, and a null array as null.
func TestHeaderReadsAnArrayOrANull(t *testing.T) {
	n, null, rest, err := Header([]byte("*2\r\n:1\r\n:2\r\n"))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.False(t, null)
	require.Equal(t, ":1\r\n:2\r\n", string(rest))
	for _, raw := range []string{"*-1\r\n", "_\r\n"} {
		_, null, _, err := Header([]byte(raw))
		require.NoError(t, err)
		require.True(t, null)
	}
	_, _, _, err = Header([]byte("+OK\r\n"))
	require.ErrorIs(t, err, ErrMalformed)
}

// NextBulk gives a bulk string's body as a slice of its input.
func TestNextBulkSharesItsInput(t *testing.T) {
	b := []byte("$3\r\nabc\r\n$-1\r\n:5\r\n")
	s, null, other, rest, err := NextBulk(b)
	require.NoError(t, err)
	require.Equal(t, "abc", string(s))
	require.Same(t, &b[4], &s[0])
	require.False(t, null)
	require.Nil(t, other)
	_, null, _, rest, err = NextBulk(rest)
	require.NoError(t, err)
	require.True(t, null)
	_, _, other, _, err = NextBulk(rest)
	require.NoError(t, err)
	require.Equal(t, int64(5), other)
}

// FuzzNext feeds Next any bytes: it never panics, and what it reads, it
// reads whole.
func FuzzNext(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "*2\r\n$1\r\na\r\n:1\r\n", "%1\r\n+a\r\n_\r\n", "|1\r\n+a\r\n+b\r\n#t\r\n", "!3\r\nERR\r\n", "=5\r\ntxt:a\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, rest, err := Next(b)
		if err == nil && len(rest) > len(b) {
			t.Fatalf("rest longer than the input")
		}
		_, _, _, _, _ = NextBulk(b)
		_, _, _, _ = Header(b)
	})
}

func TestCommonStatusRepliesAllocateNothing(t *testing.T) {
	for _, in := range []string{"+OK\r\n", "+QUEUED\r\n", ":12\r\n"} {
		b := []byte(in)
		allocs := testing.AllocsPerRun(100, func() {
			if _, _, err := Next(b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Next(%q): %v allocations, want 0", in, allocs)
		}
	}
}
