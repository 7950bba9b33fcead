package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Cluster is a real Redis Cluster of masters on loopback ports, joined with
// redis-cli --cluster create.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the masters' host:port addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartCluster starts masters redis-servers with cluster-enabled yes,
// joins them (slots split evenly, no replicas), waits until every node
// says cluster_state:ok, and stops them all when tb ends. extra are more
// redis-server arguments for every node, e.g.
// "--cluster-require-full-coverage", "no". Without redis-server or
// redis-cli it skips tb, or fails it in CI.
func StartCluster(tb testing.TB, masters int, extra ...string) *Cluster {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if Binary() == "" || err != nil {
		missing(tb)
	}
	c := &Cluster{}
	for i := range masters {
		dir := filepath.Join(tb.TempDir(), "node"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		// The bus port defaults to port+10000, which a free port near the top
		// of the range would push past 65535: pick a free one too.
		bus, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s, err := start(dir, Options{Args: append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(bus),
		}, extra...)})
		if err != nil {
			tb.Fatalf("redistest: cluster node %d: %v", i, err)
		}
		tb.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return c
}

// WaitOK waits until every node reports cluster_state:ok and agrees on
// every slot's owner.
func (c *Cluster) WaitOK(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		for _, n := range c.Nodes {
			cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
			info, err := cl.ClusterInfo(context.Background()).Result()
			cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ok after %v", limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Client returns a cluster client of c, closed when tb ends.
func (c *Cluster) Client(tb testing.TB, opt func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{
		Addrs:                    c.Addrs(),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if opt != nil {
		opt(o)
	}
	cl := redis.NewClusterClient(o)
	tb.Cleanup(func() { cl.Close() })
	return cl
}

// Reshard moves n slots from one node to another with redis-cli --cluster
// reshard, as an operator would, while the cluster serves traffic.
func (c *Cluster) Reshard(from, to *Server, n int) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return err
	}
	id := func(s *Server) (string, error) {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer cl.Close()
		return cl.ClusterMyID(context.Background()).Result()
	}
	fromID, err := id(from)
	if err != nil {
		return err
	}
	toID, err := id(to)
	if err != nil {
		return err
	}
	out, err := exec.Command(cli, "--cluster", "reshard", from.Addr, "--cluster-from", fromID, "--cluster-to", toID,
		"--cluster-slots", strconv.Itoa(n), "--cluster-yes", "--cluster-pipeline", "100").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	return c.WaitOK(30 * time.Second)
}
