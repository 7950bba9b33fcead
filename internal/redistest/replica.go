package redistest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicated is a master and its replicas, each a redis-server of its own
// on a loopback port, replicating with REPLICAOF.
type Replicated struct {
	Master   *Server
	Replicas []*Server
}

// StartReplicated starts a master and n replicas of it, waits until the
// master counts every replica online and each replica's link is up, and
// stops them all when tb ends. extra are more redis-server arguments for
// every server. Without redis-server it skips tb, or fails it in CI.
func StartReplicated(tb testing.TB, n int, extra ...string) *Replicated {
	tb.Helper()
	r := &Replicated{Master: Start(tb, Options{Args: extra})}
	host, port, _ := net.SplitHostPort(r.Master.Addr)
	for range n {
		args := append([]string{"--replicaof", host, port}, extra...)
		r.Replicas = append(r.Replicas, Start(tb, Options{Args: args}))
	}
	if err := r.WaitSynced(10 * time.Second); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return r
}

// Addrs returns the master's address, then the replicas'.
func (r *Replicated) Addrs() []string {
	out := []string{r.Master.Addr}
	for _, s := range r.Replicas {
		out = append(out, s.Addr)
	}
	return out
}

// WaitSynced waits until the master counts every replica online and each
// replica's link to it is up, for at most limit.
func (r *Replicated) WaitSynced(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := r.synced()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication not up after %v: %w", limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *Replicated) synced() error {
	info, err := infoOf(r.Master.Addr)
	if err != nil {
		return err
	}
	if online := strings.Count(info, "state=online"); online < len(r.Replicas) {
		return fmt.Errorf("master %s counts %d of %d replicas online", r.Master.Addr, online, len(r.Replicas))
	}
	for _, s := range r.Replicas {
		info, err := infoOf(s.Addr)
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica %s: link to the master not up", s.Addr)
		}
	}
	return nil
}

func infoOf(addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Info(ctx, "replication").Result()
}

// Freeze stops the server's process (SIGSTOP), as a long pause would: it
// keeps its connections and answers nothing until Thaw. Stop and the end
// of the test kill a frozen server too.
func (s *Server) Freeze() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redistest: %s is not running", s.Addr)
	}
	return freeze(s.cmd.Process)
}

// Thaw resumes a server stopped by Freeze (SIGCONT).
func (s *Server) Thaw() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redistest: %s is not running", s.Addr)
	}
	return thaw(s.cmd.Process)
}

// Pid returns the server process's ID, or 0 when it is not running.
func (s *Server) Pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}
