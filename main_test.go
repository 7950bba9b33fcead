package jobkey

import (
	"context"
	"net"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
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
