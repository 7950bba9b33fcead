package jobkey

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

type resize struct {
	Image string
	Sizes []int
	Blob  []byte
	Parts []part
}

type part struct{ A, B string }

func (resize) Kind() string { return "resize" }

func TestArgsRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	in := resize{Image: "cat.png", Sizes: []int{64, 128}, Blob: []byte{1, 2}, Parts: []part{{"a", "b"}}}
	j, err := EnqueueArgs(f.ctx, f.q, in, nil)
	require.NoError(t, err)
	require.Equal(t, "resize", j.Type)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	out, err := DecodeArgs[resize](c)
	require.NoError(t, err)
	require.Equal(t, in, out)

	var seen resize
	h := HandleArgs(func(ctx context.Context, j *Job, a resize) ([]byte, error) { seen = a; return []byte("ok"), nil })
	res, err := Mux{"resize": h}.Work(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, "ok", string(res))
	require.Equal(t, in, seen)

	_, err = Mux{}.Work(f.ctx, c)
	require.ErrorIs(t, err, ErrSkipRetry)
	require.ErrorContains(t, err, `no handler for job type "resize"`)
}

func TestDecodeArgsRefusesHostilePayloads(t *testing.T) {
	t.Parallel()
	good, err := msgpack.Marshal(resize{Image: "x"})
	require.NoError(t, err)
	hostile := map[string][]byte{
		"bin32 of 4 GiB":   binary.BigEndian.AppendUint32([]byte{0x81, 0xa4, 'B', 'l', 'o', 'b', 0xc6}, 0xffffffff),
		"array32 of parts": binary.BigEndian.AppendUint32([]byte{0x81, 0xa5, 'P', 'a', 'r', 't', 's', 0xdd}, 0xffffffff),
		"trailing":         append(bytes.Clone(good), 0x01),
		"truncated":        good[:len(good)-1],
		"deep":             bytes.Repeat([]byte{0x91}, 200),
	}
	for name, p := range hostile {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := DecodeArgs[resize](&Job{ID: "h", Type: "resize", Payload: p})
		runtime.ReadMemStats(&after)
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), name)
	}
	_, err = DecodeArgs[resize](&Job{Type: "other"})
	require.ErrorContains(t, err, `not "resize"`)
	_, err = HandleArgs(func(context.Context, *Job, resize) ([]byte, error) { return nil, nil }).
		Work(context.Background(), &Job{Type: "resize", Payload: []byte{0xc1}})
	require.True(t, errors.Is(err, ErrSkipRetry) && errors.Is(err, ErrCorrupt))
}
