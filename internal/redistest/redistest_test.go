package redistest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

// A restart keeps the data, with AOF (appendfsync always) and without it
// (SHUTDOWN SAVE writes an RDB snapshot).
func TestRestartKeepsData(t *testing.T) {
	for _, aof := range []bool{true, false} {
		t.Run(map[bool]string{true: "aof", false: "rdb"}[aof], func(t *testing.T) {
			t.Parallel()
			s := Start(t, Options{AOF: aof})
			ctx := context.Background()
			c := ClientFor(t, s.URL(), nil)
			require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
			mode, err := c.ConfigGet(ctx, "appendonly").Result()
			require.NoError(t, err)
			require.Equal(t, map[bool]string{true: "yes", false: "no"}[aof], mode["appendonly"])
			s.Restart(t)
			c2 := ClientFor(t, s.URL(), nil)
			require.Equal(t, "v", c2.Get(ctx, "k").Val())
		})
	}
}

func TestSharedAndPrefix(t *testing.T) {
	t.Parallel()
	tg := Shared(t)
	if InCI() {
		require.True(t, tg.Real, "CI must test against a real redis-server")
	}
	require.NotEqual(t, Prefix(t), Prefix(t))
	require.NoError(t, Client(t, nil).Ping(context.Background()).Err())
}
