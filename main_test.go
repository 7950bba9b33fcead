package jobkey

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// hooked returns a client of the shared test server with a round-trip hook.
func hooked(t *testing.T, poolSize int) (*redis.Client, *rttcount.Hook) {
	t.Helper()
	c := redistest.Client(t, func(o *redis.Options) {
		if poolSize > 0 {
			o.PoolSize = poolSize
		}
		// Connection set-up (HELLO, CLIENT SETINFO) goes outside the hooks,
		// but keep it quiet and identical for every test.
		o.DisableIdentity = true
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
	h := &rttcount.Hook{}
	c.AddHook(h)
	return c, h
}

// pipeHook runs before every pipeline (and MULTI/EXEC) a client sends: a
// test slows or fails chosen ones with it. Returning an error sends nothing.
type pipeHook func(ctx context.Context, cmds []redis.Cmder) error

func (h pipeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h(ctx, cmds); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// names returns "cmd key" for each command of a pipeline, for matching.
func names(cmds []redis.Cmder) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.Name()
		if a := c.Args(); len(a) > 1 {
			out[i] += " " + fmt.Sprint(a[1])
		}
	}
	return out
}

// has reports whether a pipeline holds a command whose "cmd key" starts
// with cmd and ends with keySuffix.
func has(cmds []redis.Cmder, cmd, keySuffix string) bool {
	for _, n := range names(cmds) {
		if strings.HasPrefix(n, cmd+" ") && strings.HasSuffix(n, keySuffix) {
			return true
		}
	}
	return false
}

// sleepCtxOr waits d or until ctx ends, as a slow network would.
func sleepCtxOr(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// getHook delays the reply of chosen single commands (not pipelines).
type getHook func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

func (h getHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h getHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h(ctx, cmd, next) }
}

func (h getHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

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
