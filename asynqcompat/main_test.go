package asynqcompat

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is a dedicated redis-server: asynq's keys live under the fixed
// prefix "asynq:", so tests that use asynq cannot share a server.
type env struct {
	rdb *redis.Client
	ctx context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := redistest.Start(t, redistest.Options{})
	rdb := redistest.ClientFor(t, s.URL(), func(o *redis.Options) { o.PoolSize = 64 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &env{rdb: rdb, ctx: ctx}
}

func (e *env) queue(t *testing.T, name string, cfg *jobkey.Config) *jobkey.Queue {
	t.Helper()
	q, err := jobkey.NewQueue(e.rdb, name, cfg)
	require.NoError(t, err)
	return q
}
