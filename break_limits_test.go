package jobkey

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// BREAK: Config.MaxValueBytes "refuses jobs whose stored value would be
// larger, with ErrTooLarge, before anything is written", but only Enqueue,
// Update and Complete (on the caller's copy) check it. Fail stores up to
// MaxErrorLen bytes of LastError with no check, so a job near the limit
// is written past it.
func TestBreakFailWritesPastMaxValueBytes(t *testing.T) {
	t.Parallel()
	const limit = 2048
	f := setup(t, &Config{MaxValueBytes: limit})
	payload := make([]byte, limit-200)
	j, err := f.q.Enqueue(f.ctx, "t", payload, nil)
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	_, err = f.q.Fail(f.ctx, c, errors.New(strings.Repeat("x", MaxErrorLen)))
	key, _ := f.q.ks.jobKeyOf(j.ID)
	n, serr := f.rdb.StrLen(f.ctx, key).Result()
	require.NoError(t, serr)
	t.Logf("Fail returned %v; stored value is %d bytes, limit %d", err, n, limit)
	require.LessOrEqual(t, n, int64(limit), "a value larger than Config.MaxValueBytes was written")
}
