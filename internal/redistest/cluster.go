package redistest

import (
	"context"
	"fmt"
	"net"
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

// Cluster is a real Redis Cluster on loopback ports, joined with redis-cli
// --cluster create: masters, and replicas of them when started with
// StartClusterWithReplicas.
type Cluster struct {
	Nodes []*Server // every node, masters and replicas, in start order
}

// Addrs returns the nodes' host:port addresses.
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
	return startCluster(tb, masters, 0, append([]string{"--cluster-node-timeout", "5000"}, extra...))
}

// ClusterNodeTimeout is the cluster-node-timeout of the nodes of
// StartClusterWithReplicas: how long a silent master takes to be failed
// and replaced by one of its replicas.
const ClusterNodeTimeout = time.Second

// StartClusterWithReplicas starts a cluster of masters with replicas
// replicas each (redis-cli --cluster create --cluster-replicas), tuned to
// fail a silent master over within about two seconds, and waits until
// every replica is in sync. extra are as for StartCluster.
func StartClusterWithReplicas(tb testing.TB, masters, replicas int, extra ...string) *Cluster {
	tb.Helper()
	c := startCluster(tb, masters, replicas, append([]string{
		"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout.Milliseconds())),
		// A replica that lost its master a moment ago may stand at once.
		"--cluster-replica-validity-factor", "0",
	}, extra...))
	// In sync both ways: each replica's link is up, and each master counts
	// its replicas online (a master may still be serving a replica's full
	// sync, state=wait_bgsave, after the replica's link came up).
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		for !nodeInSync(n.Addr, replicas) {
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: cluster node %s: replication not in sync after 30s", n.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// nodeInSync reports a replica whose link to its master is up, or a master
// that counts replicas of its own online.
func nodeInSync(addr string, replicas int) bool {
	if role(addr) == "slave" {
		return replicaInSync(addr)
	}
	info, err := infoOf(addr)
	return err == nil && strings.Count(info, "state=online") >= replicas
}

func startCluster(tb testing.TB, masters, replicas int, extra []string) *Cluster {
	tb.Helper()
	if _, err := exec.LookPath("redis-cli"); Binary() == "" || err != nil {
		missing(tb)
	}
	// A port picked free may be taken by a parallel test's server before
	// a node binds it, and then the nodes never join: a cluster that does
	// not form in time is stopped and started again on new ports.
	var err error
	for try := 1; ; try++ {
		var c *Cluster
		c, err = newCluster(tb.TempDir(), masters, replicas, extra)
		if err == nil {
			tb.Cleanup(c.stop)
			return c
		}
		if c != nil {
			c.stop()
		}
		if try == 3 {
			break
		}
		tb.Logf("redistest: cluster did not form (try %d of 3), starting it again: %v", try, err)
	}
	tb.Fatalf("redistest: %v", err)
	return nil
}

// newCluster starts and joins the nodes of a cluster in directories under
// dir. On an error, the nodes it started are in the returned Cluster, for
// its caller to stop.
func newCluster(dir string, masters, replicas int, extra []string) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := range masters * (1 + replicas) {
		dir := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return c, err
		}
		// The bus port defaults to port+10000, which a free port near the top
		// of the range would push past 65535: pick a free one too.
		bus, err := freePort()
		if err != nil {
			return c, err
		}
		s, err := start(dir, Options{Args: append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(bus),
		}, extra...)})
		if err != nil {
			return c, fmt.Errorf("cluster node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	// redis-cli waits for the nodes to join for as long as it takes: a
	// node that cannot reach another's bus would hold it for ever.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return c, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	return c, c.WaitOK(30 * time.Second)
}

// stop stops every node.
func (c *Cluster) stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// WaitOK waits until every node still running reports cluster_state:ok
// and agrees on every slot's owner.
func (c *Cluster) WaitOK(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		for _, n := range c.Nodes {
			if n.Exited() {
				continue
			}
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

// Masters returns the nodes that say they are masters now (ROLE).
func (c *Cluster) Masters() []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		if !n.Exited() && role(n.Addr) == "master" {
			out = append(out, n)
		}
	}
	return out
}

// ReplicaOf returns a running node that replicates master, or nil.
func (c *Cluster) ReplicaOf(master *Server) *Server {
	if rs := c.ReplicasOf(master); len(rs) > 0 {
		return rs[0]
	}
	return nil
}

// ReplicasOf returns the running nodes that replicate master.
func (c *Cluster) ReplicasOf(master *Server) []*Server {
	_, port, _ := net.SplitHostPort(master.Addr)
	var out []*Server
	for _, n := range c.Nodes {
		if n == master || n.Exited() {
			continue
		}
		cl := plainClient(n.Addr)
		info, err := cl.Info(context.Background(), "replication").Result()
		cl.Close()
		if err == nil && infoField(info, "role") == "slave" && infoField(info, "master_port") == port {
			out = append(out, n)
		}
	}
	return out
}

// WaitPromoted waits until replica says it is a master and every node
// still running reports cluster_state:ok with every slot served, and
// returns the time the promotion was first seen (polled every 20 ms).
func (c *Cluster) WaitPromoted(replica *Server, limit time.Duration) (time.Time, error) {
	return c.WaitOnePromoted(limit, replica)
}

// WaitOnePromoted is WaitPromoted for the first of replicas to say it is a
// master: the replicas of one master, of which the cluster promotes one.
func (c *Cluster) WaitOnePromoted(limit time.Duration, replicas ...*Server) (time.Time, error) {
	deadline := time.Now().Add(limit)
	var at time.Time
	for {
		for _, r := range replicas {
			if at.IsZero() && role(r.Addr) == "master" {
				at = time.Now()
			}
		}
		if !at.IsZero() && c.WaitOK(0) == nil {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no replica of %d promoted, or the cluster not ok, after %v", len(replicas), limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
