package cpumeter

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestParseCPUAddsSystemAndUserTime(t *testing.T) {
	t.Parallel()
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.750000\r\nused_cpu_sys_children:9.000000\r\n"
	require.Equal(t, 2*time.Second, parse(info))
	require.Zero(t, parse("used_cpu_sys:bogus\r\n"))
}

// Both meters move when there is work: this process's CPU, and Redis's.
func TestProcessAndRedisCPUGrowWithWork(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	p0, r0 := Process(), Redis(ctx, rdb)
	key := redistest.Prefix(t) + ":k"
	for i := range 2000 {
		require.NoError(t, rdb.Set(ctx, key, i, 0).Err())
	}
	require.Greater(t, Process(), p0)
	require.Greater(t, Redis(ctx, rdb), r0)
}
