package jobkey

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// quietLog drops jobkey's log lines.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newerMajorValue returns a stored value in format major version 2.
func newerMajorValue(t *testing.T) []byte {
	t.Helper()
	golden, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	b := bytes.Clone(golden)
	b[3] = 2 // format major version 2
	return b
}

// plantNewer stores a newer-major value under id with a ready entry due at score ms.
func plantNewer(t *testing.T, ctx context.Context, rdb redis.Cmdable, q *Queue, id string, score int64, b []byte) {
	t.Helper()
	keys := q.Keys(id)
	require.NoError(t, rdb.Set(ctx, keys.Job, b, 0).Err())
	require.NoError(t, rdb.ZAdd(ctx, keys.Ready, redis.Z{Score: float64(score), Member: id}).Err())
}
