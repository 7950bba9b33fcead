package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The replicas of StartReplicated follow the master; a frozen replica
// confirms nothing until it is thawed.
func TestReplicatedFollowsAndFreezes(t *testing.T) {
	t.Parallel()
	r := StartReplicated(t, 2)
	require.Len(t, r.Addrs(), 3)
	ctx := context.Background()
	m := ClientFor(t, r.Master.URL(), nil)
	require.NoError(t, m.Set(ctx, "k", "v", 0).Err())
	n, err := m.Wait(ctx, 2, 5*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	for _, s := range r.Replicas {
		require.Equal(t, "v", ClientFor(t, s.URL(), nil).Get(ctx, "k").Val())
	}

	require.NoError(t, r.Replicas[0].Freeze())
	require.NoError(t, m.Set(ctx, "k", "w", 0).Err())
	n, err = m.Wait(ctx, 2, 200*time.Millisecond).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the frozen replica does not acknowledge")
	require.NoError(t, r.Replicas[0].Thaw())
	n, err = m.Wait(ctx, 2, 5*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.NoError(t, r.WaitSynced(5*time.Second))
	require.NotZero(t, r.Master.Pid())
}
