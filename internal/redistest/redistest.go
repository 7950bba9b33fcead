// Package redistest gives tests a real Redis: a redis-server it starts on a
// free loopback port in a temporary directory, or the server named by
// JOBKEY_TEST_REDIS_URL. Each test isolates itself with its own key prefix,
// so tests run in parallel and no test ever flushes a server.
//
// Without a redis-server binary, and only when CI is not set, it falls back
// to an in-process miniredis and says so; tests that need real Redis then
// skip with the reason. With CI set, a missing server fails the run.
package redistest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobkey/jobkey/internal/rttcount"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// EnvURL names an existing server for the tests to use instead of starting one.
const EnvURL = "JOBKEY_TEST_REDIS_URL"

// Options configure a server this package starts.
type Options struct {
	AOF bool // append-only file with appendfsync always (default: off)
	// Args are extra redis-server arguments, e.g. {"--maxmemory", "10mb"}.
	Args []string

	// sentinelConf, when set, starts a Sentinel with this configuration
	// file (which Sentinel rewrites) instead of a data server.
	sentinelConf string
}

// Server is a redis-server process started for tests.
type Server struct {
	Addr string // host:port
	opts Options
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// URL returns a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Binary returns the path of redis-server, or "" when none is installed.
func Binary() string {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return ""
	}
	return p
}

// InCI reports whether the tests run in CI, where nothing may be missing.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "0" && v != "false"
}

// Start starts a dedicated redis-server for tb, stopped when tb ends. With
// no redis-server installed it skips tb, or fails it in CI.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if Binary() == "" {
		missing(tb)
	}
	dir := tb.TempDir()
	s, err := start(dir, opts)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() { s.Stop() })
	return s
}

func missing(tb testing.TB) {
	tb.Helper()
	if InCI() {
		tb.Fatal("redistest: redis-server not found and CI is set: install it (apt-get install redis-server)")
	}
	tb.Skip("redistest: redis-server not found; this test needs a real Redis")
}

func start(dir string, opts Options) (*Server, error) {
	var lastErr error
	for try := 0; try < 5; try++ { // a free port can be taken between probe and bind
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), opts: opts, dir: dir}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{
		"--port", port, "--bind", "127.0.0.1", "--dir", s.dir, "--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"), "--protected-mode", "no",
	}
	if s.opts.sentinelConf == "" {
		// A replica's full sync starts at once, not after the 5 s Redis
		// waits by default for more replicas to share one transfer: every
		// replicated setup, and every resync after a failover, pays it.
		args = append(args, "--repl-diskless-sync-delay", "0")
	}
	switch {
	case s.opts.sentinelConf != "":
		args = append([]string{s.opts.sentinelConf, "--sentinel"}, args...)
	case s.opts.AOF:
		args = append(args, "--save", "", "--appendonly", "yes", "--appendfsync", "always")
	default:
		args = append(args, "--save", "", "--appendonly", "no")
	}
	args = append(args, s.opts.Args...)
	s.cmd = exec.Command(Binary(), args...)
	s.cmd.SysProcAttr = sysProcAttr() // dies with the test process
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	if err := waitReady(s.Addr, s.done, 10*time.Second); err != nil {
		s.kill()
		logTail, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		return fmt.Errorf("redis-server on %s: %w\n%s", s.Addr, err, tail(string(logTail), 800))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func waitReady(addr string, exited <-chan struct{}, limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart stops the server with SHUTDOWN SAVE (or an AOF flush) and starts
// it again on the same port and directory, so the data survives.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	_ = c.Do(context.Background(), "shutdown", "save").Err() // the reply is the closed connection
	c.Close()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		tb.Fatal("redistest: redis-server did not shut down")
	}
	if err := s.launch(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// Crash kills the server abruptly (SIGKILL), as a crash would, and leaves
// its directory for Relaunch.
func (s *Server) Crash() { s.kill() }

// Relaunch starts a crashed server again on the same port and directory:
// with AOF it comes back with what it had acknowledged.
func (s *Server) Relaunch(tb testing.TB) {
	tb.Helper()
	if err := s.launch(); err != nil {
		tb.Fatalf("redistest: relaunch: %v", err)
	}
}

// kill stops the server abruptly, as a crash would.
func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Stop kills the server and waits for it to exit.
func (s *Server) Stop() { s.kill() }

// Exited reports whether the server's process has ended (Crash, Stop).
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stall stops the server's process (SIGSTOP) for d and then lets it go on
// (SIGCONT), as a long GC pause or a swapped-out host would: it answers
// nothing meanwhile, and its sockets fill. It returns at once; done is
// closed when the process runs again.
func (s *Server) Stall(d time.Duration) (done <-chan struct{}, err error) {
	if err := s.Freeze(); err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		time.Sleep(d)
		_ = s.Thaw()
	}()
	return ch, nil
}

// ---- the package-wide target --------------------------------------------

// Target is the Redis a test package shares.
type Target struct {
	URL      string // redis:// URL of the server
	Real     bool   // a real redis-server (false: miniredis fallback)
	Reason   string // why it is not real, when it is not
	External bool   // named by JOBKEY_TEST_REDIS_URL
}

var (
	sharedOnce   sync.Once
	sharedTarget Target
	sharedErr    error
	sharedServer *Server
	sharedMini   *miniredis.Miniredis
	sharedDir    string

	clusterOnce   sync.Once
	sharedCluster *Cluster
	clusterErr    error
	clusterDir    string
)

// Main runs a test package's tests and stops its shared server afterwards.
// Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if sharedServer != nil {
		sharedServer.Stop()
	}
	if sharedMini != nil {
		sharedMini.Close()
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	if sharedCluster != nil {
		sharedCluster.stop()
	}
	if clusterDir != "" {
		os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

// SharedCluster returns a cluster of three masters (as StartCluster(tb, 3)
// makes) started once for the test package, on its first call, and stopped
// by Main. Tests that share it isolate themselves by key prefix, as on the
// shared server: one that stops, freezes or reshards a node, or counts a
// node's commands, starts a cluster of its own. Without redis-server or
// redis-cli it skips tb, or fails it in CI.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	if _, err := exec.LookPath("redis-cli"); Binary() == "" || err != nil {
		missing(tb)
	}
	clusterOnce.Do(func() {
		clusterDir, clusterErr = os.MkdirTemp("", "jobkey-redistest-cluster-")
		// Started again on new ports when it does not form (startCluster
		// says why).
		for try := 0; clusterErr == nil && try < 3; try++ {
			var c *Cluster
			c, clusterErr = newCluster(filepath.Join(clusterDir, strconv.Itoa(try)), 3, 0, []string{"--cluster-node-timeout", "5000"})
			if clusterErr == nil {
				sharedCluster = c
				break
			}
			if c != nil {
				c.stop()
			}
			if try < 2 {
				clusterErr = nil
			}
		}
	})
	if clusterErr != nil {
		tb.Fatalf("redistest: shared cluster: %v", clusterErr)
	}
	return sharedCluster
}

// Shared returns the package's Redis: JOBKEY_TEST_REDIS_URL if set, else a
// redis-server started once for the package, else (outside CI) miniredis.
func Shared(tb testing.TB) Target {
	tb.Helper()
	t, err := SharedTarget()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return t
}

// SharedTarget is Shared for code without a testing.TB, such as examples.
func SharedTarget() (Target, error) {
	sharedOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			sharedTarget = Target{URL: u, Real: true, External: true}
			return
		}
		if Binary() == "" {
			if InCI() {
				sharedErr = errors.New("redis-server not found and CI is set: install it (apt-get install redis-server)")
				return
			}
			m, err := miniredis.Run()
			if err != nil {
				sharedErr = err
				return
			}
			sharedMini = m
			sharedTarget = Target{URL: "redis://" + m.Addr(), Reason: "redis-server not found; using in-process miniredis"}
			log.Printf("redistest: %s (install redis-server or set %s for real-Redis tests)", sharedTarget.Reason, EnvURL)
			return
		}
		dir, err := os.MkdirTemp("", "jobkey-redistest-")
		if err != nil {
			sharedErr = err
			return
		}
		sharedDir = dir
		s, err := start(dir, Options{})
		if err != nil {
			sharedErr = err
			return
		}
		sharedServer = s
		sharedTarget = Target{URL: s.URL(), Real: true}
	})
	return sharedTarget, sharedErr
}

// RequireReal skips tb when the shared target is the miniredis fallback.
func RequireReal(tb testing.TB) Target {
	tb.Helper()
	t := Shared(tb)
	if !t.Real {
		tb.Skipf("redistest: needs a real Redis: %s", t.Reason)
	}
	return t
}

// Client returns a client of the shared target, closed when tb ends. opt
// may adjust the options (pool size, hooks are added afterwards).
func Client(tb testing.TB, opt func(*redis.Options)) *redis.Client {
	tb.Helper()
	return ClientFor(tb, Shared(tb).URL, opt)
}

// ClientFor returns a client of url, closed when tb ends.
func ClientFor(tb testing.TB, url string, opt func(*redis.Options)) *redis.Client {
	tb.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	// Redis 7 has no maintenance notifications to offer: the client does
	// not ask for them. (go-redis v9.23's "auto" mode would ask once and
	// turn itself off, under the client's lock; the README's quick start
	// runs so under -race, TestREADMEQuickStartRunsAsWrittenUnderRace.)
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if opt != nil {
		opt(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { c.Close() })
	return c
}

// Prefix returns a key prefix no other test uses, so tests sharing a server
// never see each other's keys.
func Prefix(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "-", " ", "-", "{", "", "}", "").Replace(tb.Name())
	return cmp.Or("t-"+name[:min(len(name), 24)], "t") + "-" + hex.EncodeToString(b[:])
}

// CarryHook runs f on every pipeline that carries a read behind its EXEC
// (a WATCH after an EXEC: the compare-and-set's hand-over), around the
// call that sends it.
type CarryHook func(ctx context.Context, cmds []redis.Cmder, send func() error) error

// DialHook leaves dialing alone.
func (h CarryHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook leaves single commands alone.
func (h CarryHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook runs h on the pipelines that carry a read.
func (h CarryHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !CarriesRead(cmds) {
			return next(ctx, cmds)
		}
		return h(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}

// LoseAfterEXEC sends cmds, then loses the replies after the EXEC's:
// Redis ran everything, the client hears only up to the EXEC.
func LoseAfterEXEC(cmds []redis.Cmder, send func() error) error {
	err := send()
	after := false
	for _, c := range cmds {
		if after {
			c.SetErr(io.ErrUnexpectedEOF)
		}
		after = after || c.Name() == "exec"
	}
	return err
}

// CarriesRead reports a pipeline with a WATCH after its EXEC.
func CarriesRead(cmds []redis.Cmder) bool {
	exec := false
	for _, c := range cmds {
		switch c.Name() {
		case "exec":
			exec = true
		case "watch":
			if exec {
				return true
			}
		}
	}
	return false
}

// Counted returns a client of the shared test server whose round trips
// and commands a hook counts; poolSize > 0 sets its pool's size.
// Connection set-up (HELLO, CLIENT SETINFO) goes outside the hook, and is
// kept quiet and identical for every test.
func Counted(tb testing.TB, poolSize int) (*redis.Client, *rttcount.Hook) {
	tb.Helper()
	c := Client(tb, func(o *redis.Options) {
		if poolSize > 0 {
			o.PoolSize = poolSize
		}
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
