package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// SentinelMaster is the name the Sentinels of StartSentinel monitor.
const SentinelMaster = "jobkey"

// Sentinel is a master, its replicas and three Sentinels that watch them,
// on loopback ports, tuned to fail over within about a second.
type Sentinel struct {
	Master    *Server   // the master at start; after a failover, see Current
	Replicas  []*Server // its replicas at start
	Sentinels []*Server
}

// SentinelDownAfter is how long the Sentinels of StartSentinel wait for a
// silent master before they call it down and elect a replica.
const SentinelDownAfter = 500 * time.Millisecond

// StartSentinel starts a master, replicas replicas of it and three
// Sentinels (redis-server --sentinel) with a quorum of two, waits until the
// replicas are in sync and every Sentinel knows them all, and stops
// everything when tb ends. Without redis-server it skips tb, or fails it in
// CI.
func StartSentinel(tb testing.TB, replicas int) *Sentinel {
	tb.Helper()
	if Binary() == "" {
		missing(tb)
	}
	s := &Sentinel{Master: Start(tb, Options{})}
	s.Replicas = startReplicas(tb, s.Master, replicas)
	for i := range 3 {
		dir := filepath.Join(tb.TempDir(), "sentinel"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(s.Master.Addr)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
			"sentinel down-after-milliseconds %[1]s %[4]d\n"+
			"sentinel failover-timeout %[1]s 5000\n"+
			"sentinel parallel-syncs %[1]s 2\n", SentinelMaster, host, port, SentinelDownAfter.Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
		sen, err := start(dir, Options{sentinelConf: conf})
		if err != nil {
			tb.Fatalf("redistest: sentinel %d: %v", i, err)
		}
		tb.Cleanup(sen.Stop)
		s.Sentinels = append(s.Sentinels, sen)
	}
	if err := s.waitKnown(replicas, 60*time.Second); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return s
}

// startReplicas starts n replicas of master and waits until each is in
// sync with it.
func startReplicas(tb testing.TB, master *Server, n int) []*Server {
	tb.Helper()
	host, port, _ := net.SplitHostPort(master.Addr)
	var out []*Server
	for range n {
		out = append(out, Start(tb, Options{Args: []string{"--replicaof", host, port}}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range out {
		for !replicaInSync(r.Addr) {
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: replica %s not in sync with %s after 30s", r.Addr, master.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

func plainClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 300 * time.Millisecond,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
}

func replicaInSync(addr string) bool {
	c := plainClient(addr)
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	return err == nil && infoField(info, "master_link_status") == "up"
}

// waitKnown waits until every Sentinel sees the master and n replicas, and
// the other two Sentinels.
func (s *Sentinel) waitKnown(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		var seen string // what the first Sentinel that is not ready says
		for _, sen := range s.Sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr, MaxRetries: -1})
			m, err := c.Master(context.Background(), SentinelMaster).Result()
			c.Close()
			if err != nil || m["num-slaves"] != strconv.Itoa(n) || m["num-other-sentinels"] != "2" {
				ok = false
				seen = fmt.Sprintf("sentinel %s: replicas %q, other sentinels %q, flags %q, error %v",
					sen.Addr, m["num-slaves"], m["num-other-sentinels"], m["flags"], err)
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinels do not know the master, %d replicas and each other after %v (%s)", n, limit, seen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SentinelAddrs returns the Sentinels' host:port addresses.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr
	}
	return out
}

// URL returns a redis+sentinel:// URL of the setup, as the jobkey command
// takes it.
func (s *Sentinel) URL() string {
	u := "redis+sentinel://"
	for i, a := range s.SentinelAddrs() {
		if i > 0 {
			u += ","
		}
		u += a
	}
	return u + "/" + SentinelMaster
}

// Client returns a go-redis FailoverClient of the setup, closed when tb
// ends. opt may adjust its options.
func (s *Sentinel) Client(tb testing.TB, opt func(*redis.FailoverOptions)) *redis.Client {
	tb.Helper()
	o := &redis.FailoverOptions{
		MasterName:    SentinelMaster,
		SentinelAddrs: s.SentinelAddrs(),
	}
	if opt != nil {
		opt(o)
	}
	c := redis.NewFailoverClient(o)
	tb.Cleanup(func() { c.Close() })
	return c
}

// MasterAddr returns the master's address as the first Sentinel that
// answers says it is.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var firstErr error
	for _, sen := range s.Sentinels {
		if sen.Exited() {
			continue
		}
		c := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr, MaxRetries: -1, DialTimeout: 300 * time.Millisecond})
		hp, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return "", fmt.Errorf("no sentinel names the master: %v", firstErr)
}

// Current returns the server that is master now, as the Sentinels say,
// among those StartSentinel started.
func (s *Sentinel) Current(ctx context.Context) (*Server, error) {
	addr, err := s.MasterAddr(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range append([]*Server{s.Master}, s.Replicas...) {
		if n.Addr == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the sentinels name %s, which this setup did not start", addr)
}

// WaitPromoted waits until the Sentinels name a master other than old and
// that server says it is a master, and returns it with the time that was
// first seen (polled every 20 ms).
func (s *Sentinel) WaitPromoted(ctx context.Context, old *Server, limit time.Duration) (*Server, time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		if n, err := s.Current(ctx); err == nil && n != old && role(n.Addr) == "master" {
			return n, time.Now(), nil
		}
		if time.Now().After(deadline) {
			return nil, time.Time{}, fmt.Errorf("no replica of %s promoted after %v", old.Addr, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// role returns what ROLE says the server at addr is: master, slave, or ""
// when it does not answer.
func role(addr string) string {
	c := plainClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r, err := c.Do(ctx, "role").Slice()
	if err != nil || len(r) == 0 {
		return ""
	}
	s, _ := r[0].(string)
	return s
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// DropReplicas closes the master's links to its replicas (CLIENT KILL TYPE
// replica): a replica stalled meanwhile (Stall) cannot come back for what
// the master writes next, which then lives on the master alone.
func (s *Server) DropReplicas(ctx context.Context) error {
	c := plainClient(s.Addr)
	defer c.Close()
	return c.ClientKillByFilter(ctx, "TYPE", "replica").Err()
}
