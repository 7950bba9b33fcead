package jobkey

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestShardsSpreadAndStats(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	var ids []string
	for i := range 40 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("job-%d", i)})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	used := map[int]bool{}
	for _, id := range ids {
		_, s := f.q.ks.jobKeyOf(id)
		used[s] = true
	}
	require.Len(t, used, 4)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 40, st.Pending)
	var got []string
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		got = append(got, j.ID)
	}
	sort.Strings(got)
	sort.Strings(ids)
	require.Equal(t, ids, got)
}
