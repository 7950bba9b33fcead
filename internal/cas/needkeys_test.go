package cas

import (
	"context"
	"strconv"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A decision that names keys it has not read (NeedKeys) has them watched
// and read, one round trip a time, and is run again on the larger read.
// Here each key names the next, as a chain of batches does.
func TestADecisionThatNeedsKeysReadsThemUnderWatchAndDecidesAgain(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 3)
	p := redistest.Prefix(t)
	key := func(i int) string { return p + ":{k}:" + strconv.Itoa(i) }
	for i := range 3 {
		require.NoError(t, rdb.Set(ctx, key(i), strconv.Itoa(i+1), 0).Err())
	}
	decides := 0
	follow := func(r *Read) (*Plan, error) {
		decides++
		// key 0 names key 1, which names key 2, which names key 3 (missing).
		at := 0
		for {
			v, ok := r.Aux[key(at)]
			if at == 0 {
				v, ok = r.Values[0], true
			}
			if !ok {
				return nil, &NeedKeys{Keys: []string{key(at)}}
			}
			if v.Missing {
				break
			}
			at, _ = strconv.Atoi(v.S)
		}
		return &Plan{Writes: []Write{{Key: key(0), Value: []byte("done")}}}, nil
	}
	before := e.Counts()
	_, plan, err := e.Run(ctx, &Txn{Keys: []string{key(0)}, Decide: follow})
	require.NoError(t, err)
	require.NotNil(t, plan)
	require.Equal(t, 4, decides, "one decision, then one more per key it asked for")
	require.Equal(t, int64(2+3), e.Counts().RoundTrips-before.RoundTrips, "two round trips, and one per key asked for")
	got, err := rdb.Get(ctx, key(0)).Result()
	require.NoError(t, err)
	require.Equal(t, "done", got)

	// A decision that asks for a key it has read is refused, not looped.
	_, _, err = e.Run(ctx, &Txn{Keys: []string{key(1)}, Aux: []string{key(2)}, Decide: func(*Read) (*Plan, error) {
		return nil, &NeedKeys{Keys: []string{key(2)}}
	}})
	require.ErrorContains(t, err, "internal error")
}
