package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A killed master is replaced by its replica within seconds, and the
// FailoverClient follows it with the data the replica had.
func TestSentinelPromotesTheReplicaOfAKilledMaster(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t, 1)
	ctx := context.Background()
	c := s.Client(t, nil)
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	require.NoError(t, c.Wait(ctx, 1, time.Second).Err())
	killed := time.Now()
	s.Master.Crash()
	n, at, err := s.WaitPromoted(ctx, s.Master, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, s.Replicas[0], n)
	t.Logf("promoted %v after the kill", at.Sub(killed))
	require.Eventually(t, func() bool { return c.Get(ctx, "k").Val() == "v" }, 5*time.Second, 20*time.Millisecond)
}

// A cluster with replicas replaces a killed master by its replica, and
// every slot is served again.
func TestClusterWithReplicasPromotesTheReplicaOfAKilledMaster(t *testing.T) {
	t.Parallel()
	c := StartClusterWithReplicas(t, 3, 1)
	require.Len(t, c.Nodes, 6)
	masters := c.Masters()
	require.Len(t, masters, 3)
	r := c.ReplicaOf(masters[0])
	require.NotNil(t, r)
	killed := time.Now()
	masters[0].Crash()
	at, err := c.WaitPromoted(r, 20*time.Second)
	require.NoError(t, err)
	t.Logf("promoted %v after the kill", at.Sub(killed))
	require.Len(t, c.Masters(), 3)
}
