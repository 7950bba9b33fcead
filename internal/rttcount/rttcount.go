// Package rttcount counts what a go-redis client sends: round trips and
// commands. The tests hold jobkey to its round-trip budget with it, and the
// benchmarks report rtt/op and redis-cmds/op with it.
package rttcount

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Hook is a go-redis hook counting one round trip per single command and
// one per pipeline or MULTI/EXEC. The handshake go-redis sends once when it
// dials a connection (HELLO, and AUTH, SELECT or CLIENT when configured) is
// not an operation's cost and is left out.
type Hook struct {
	RTT  atomic.Int64 // round trips
	Cmds atomic.Int64 // commands, MULTI and EXEC included
}

// Reset zeroes the counters.
func (h *Hook) Reset() { h.RTT.Store(0); h.Cmds.Store(0) }

// DialHook leaves dialing alone.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a single command.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			h.RTT.Add(1)
			h.Cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline or MULTI/EXEC as one round trip.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.RTT.Add(1)
		h.Cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "select":
		return true
	case "client":
		a := cmd.Args()
		return len(a) > 1 && a[1] != "id"
	}
	return false
}

var _ redis.Hook = (*Hook)(nil)
