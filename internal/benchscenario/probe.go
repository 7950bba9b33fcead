package benchscenario

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/redact"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Probe counts what a client does on the wire: round trips and commands
// (an rttcount hook) and bytes sent and received (a counting dialer).
type Probe struct {
	rttcount.Hook
	BytesOut, BytesIn atomic.Int64
}

// Snapshot is a copy of a Probe's counters.
type Snapshot struct{ RTT, Cmds, BytesOut, BytesIn int64 }

// Snap reads the counters.
func (p *Probe) Snap() Snapshot {
	return Snapshot{p.RTT.Load(), p.Cmds.Load(), p.BytesOut.Load(), p.BytesIn.Load()}
}

// Sub returns s - o.
func (s Snapshot) Sub(o Snapshot) Snapshot {
	return Snapshot{s.RTT - o.RTT, s.Cmds - o.Cmds, s.BytesOut - o.BytesOut, s.BytesIn - o.BytesIn}
}

type countingConn struct {
	net.Conn
	p *Probe
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.BytesIn.Add(int64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.p.BytesOut.Add(int64(n))
	return n, err
}

// ClusterClient returns a cluster client seeded with url's host, whose
// traffic p counts on every node.
func ClusterClient(url string, p *Probe, poolSize int) (*redis.ClusterClient, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("benchscenario: Redis URL %s: %w", redact.URL(url), redact.Error(err, url))
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		PoolSize: poolSize, DisableIdentity: true, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		Dialer:                   p.dial,
	})
	// The hook goes on every node's client: the compare-and-set runs on a
	// node's connection, which the cluster client's own hooks never see.
	c.OnNewNode(func(n *redis.Client) { n.AddHook(&p.Hook) })
	return c, nil
}

func (p *Probe) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{c, p}, nil
}

// Client returns a client of url whose traffic p counts. poolSize 0 keeps
// go-redis's default.
func Client(url string, p *Probe, poolSize int) (*redis.Client, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("benchscenario: Redis URL %s: %w", redact.URL(url), redact.Error(err, url))
	}
	if poolSize > 0 {
		o.PoolSize = poolSize
	}
	// As internal/redistest: Redis 7 has no maintenance notifications to offer.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.DisableIdentity = true
	o.ReadTimeout = 30 * time.Second
	o.WriteTimeout = 30 * time.Second
	o.Dialer = p.dial
	c := redis.NewClient(o)
	c.AddHook(&p.Hook)
	return c, nil
}
