package jobkey

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// rttHook counts network round trips as go-redis makes them: one per single
// command, one per pipeline or MULTI/EXEC. It is the independent witness of
// the round-trip budget; the engine's own counters are checked against it.
// The handshake go-redis sends once when it dials a connection (HELLO, and
// AUTH/SELECT/CLIENT when configured) is not an operation's cost and is
// left out.
type rttHook struct {
	rtts atomic.Int64
	cmds atomic.Int64
}

func (h *rttHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rttHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hello", "auth", "select":
			return next(ctx, cmd)
		case "client":
			if args := cmd.Args(); len(args) > 1 && args[1] != "id" {
				return next(ctx, cmd)
			}
		}
		h.rtts.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (h *rttHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.rtts.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (h *rttHook) reset() { h.rtts.Store(0); h.cmds.Store(0) }

var _ redis.Hook = (*rttHook)(nil)

// hooked returns a client of the shared test server with a round-trip hook.
func hooked(t *testing.T, poolSize int) (*redis.Client, *rttHook) {
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
	h := &rttHook{}
	c.AddHook(h)
	return c, h
}
