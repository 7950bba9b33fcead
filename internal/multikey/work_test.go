package multikey

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// stderrLog logs to stderr, as go-redis's own logger does.
type stderrLog struct{ out *log.Logger }

func (l stderrLog) Printf(_ context.Context, format string, v ...any) {
	_ = l.out.Output(2, fmt.Sprintf(format, v...))
}

// capture records what go-redis logs, and passes it on to stderr.
type capture struct {
	stderrLog
	mu    sync.Mutex
	lines []string
}

func (c *capture) Printf(ctx context.Context, format string, v ...any) {
	c.mu.Lock()
	c.lines = append(c.lines, fmt.Sprintf(format, v...))
	c.mu.Unlock()
	c.stderrLog.Printf(ctx, format, v...)
}

// popped signals once the client has sent a blocking pop. go-redis
// builds a command, and logs a timeout it rounds, before it runs the
// hooks.
type popped struct {
	once sync.Once
	ch   chan struct{}
}

func (p *popped) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *popped) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p *popped) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "blmove" {
			p.once.Do(func() { close(p.ch) })
		}
		return next(ctx, cmd)
	}
}

// An idle slot's blocking pop logs nothing: go-redis sends BLMOVE's
// timeout in whole seconds and logs each shorter one it rounds up, and in
// the burn-down benchmark those lines landed inside its result lines. The
// test runs alone (not in parallel): go-redis's logger is global.
func TestIdleSlotLogsNothing(t *testing.T) {
	q, rdb, ctx := setup(t)
	logs := &capture{stderrLog: stderrLog{log.New(os.Stderr, "redis: ", log.LstdFlags)}}
	redis.SetLogger(logs)
	t.Cleanup(func() { redis.SetLogger(logs.stderrLog) })
	p := &popped{ch: make(chan struct{})}
	rdb.AddHook(p)

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, 2, "w", func(*Job) error { return nil }) }()
	<-p.ch // a slot, with no job to take, is in its blocking pop
	cancel()
	require.NoError(t, <-done)
	logs.mu.Lock()
	defer logs.mu.Unlock()
	require.Empty(t, logs.lines, "go-redis logged while the worker ran")
}
