package cas

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// A sink that expects n values makes room for them at the first value that
// does not fit, at that value's size each: a batch of like values is read
// into about one buffer of the reply's size, and a large first value makes
// room for at most maxLookahead more.
func TestASinkSizesItsBufferFromTheFirstValue(t *testing.T) {
	body := func(n int) io.Reader {
		return &io.LimitedReader{R: bytes.NewReader(bytes.Repeat([]byte("x"), n)), N: int64(n)}
	}
	s := &sink{b: make([]byte, 0, 16+8*16), values: 16}
	_, _ = s.Write([]byte("*16\r\n"))
	grew := 0
	for range 16 {
		before := cap(s.b)
		_, _ = s.Write([]byte("$1024\r\n"))
		_, err := s.ReadFrom(body(1026))
		require.NoError(t, err)
		if cap(s.b) != before {
			grew++
		}
	}
	require.Equal(t, 1, grew, "one buffer for the batch")
	require.Less(t, cap(s.b), 2*len(s.b))

	big := &sink{b: make([]byte, 0, 16+8*256), values: 256}
	_, err := big.ReadFrom(body(1 << 20))
	require.NoError(t, err)
	require.LessOrEqual(t, cap(big.b), (1<<20)+maxLookahead+(64<<10), "room ahead is bounded")
}
