package jobkey

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Regression, found in review: storedAt (queue.go), which must refuse a
// value whose ID is not its key's job, compares by suffix: a key is judged
// right when it ends in ":job:"+ID. A legitimate job ID may contain ":job:"
// (validID allows it), so the key of job "a:job:b" also ends in ":job:b":
// job b's value copied (or forged) to it passes Get and the claim, which
// runs b's payload under b's ID, while Verify (readValue, an exact
// comparison) calls the same value corrupt.
func TestValueNamingSuffixJobIsCorrupt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	const x = "a:job:b"
	_, err := f.q.Enqueue(f.ctx, "t", []byte("x's payload"), &EnqueueOpts{ID: x})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("b's payload"), &EnqueueOpts{ID: "b"})
	require.NoError(t, err)
	raw, err := f.rdb.Get(f.ctx, f.q.Keys("b").Job).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(x).Job, raw, 0).Err()) // x's key now holds b's value
	// b itself is out of the way (it ran elsewhere and expired, say): only
	// x's key, holding b's value, is due.
	require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys("b").Job).Err())
	require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys("b").Ready, "b").Err())

	j, getErr := f.q.Get(f.ctx, x)
	if getErr == nil {
		t.Logf("Get(%q) returned job %q, payload %q", x, j.ID, j.Payload)
	}
	got, claimErr := f.q.Claim(f.ctx, "w")
	if claimErr == nil {
		t.Logf("Claim returned job %q, payload %q", got.ID, got.Payload)
	}
	require.ErrorIs(t, getErr, ErrCorrupt, "the value at %q names job b", x)
	require.ErrorIs(t, claimErr, ErrNoJob, "x's value is not x: nothing is due")
}
