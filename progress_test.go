package jobkey

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A handler's progress rides the run's next lease renewal, so Get sees it
// while the job is still active under the same claim, and the outcome
// writes the last one reported.
func TestProgressRidesTheRenewalAndTheOutcome(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: 600 * time.Millisecond})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	seen := make(chan *Job, 1)
	h := HandlerFunc(func(hctx context.Context, claimed *Job) ([]byte, error) {
		require.NoError(t, SetProgress(hctx, []byte(`{"done":1}`)))
		require.NoError(t, SetProgress(hctx, []byte(`{"done":2}`)), "a later report replaces one not yet written")
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			cur, err := q.Get(ctx, claimed.ID)
			require.NoError(t, err)
			if cur.Progress != nil {
				seen <- cur
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.NoError(t, SetProgress(hctx, []byte(`{"done":3}`)))
		return nil, nil
	})
	stop := startWork(t, q, h, nil)
	cur := <-seen
	require.Equal(t, StateActive, cur.State, "written while the run went on: by a renewal")
	require.Equal(t, `{"done":2}`, string(cur.Progress))
	waitFor(t, "the job to succeed", func() bool { return state(t, q, j.ID) == StateSucceeded })
	stop()
	done, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, `{"done":3}`, string(done.Progress), "the outcome writes the last report")
	require.Equal(t, cur.LeaseToken, done.LeaseToken)

	page, err := q.List(ctx, ListOpts{State: StateSucceeded})
	require.NoError(t, err)
	require.Equal(t, `{"done":3}`, string(page.Jobs[0].Progress), "List shows it too")
}

// SetProgress refuses a value past MaxProgressBytes and a context that is
// not a Work handler's; a caller of Claim sets Progress on its copy, and
// Extend writes it, refusing one too large before anything is written.
func TestProgressIsBounded(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, SetProgress(context.Background(), []byte("x")), ErrInvalid)
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, nil)
	c.Progress = []byte("40%")
	e, err := f.q.Extend(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, "40%", string(e.Progress))
	c.Progress = bytes.Repeat([]byte{1}, MaxProgressBytes+1)
	_, err = f.q.Extend(f.ctx, c)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.q.Complete(f.ctx, c, nil)
	require.ErrorIs(t, err, ErrInvalid)
	got, err := f.q.Get(f.ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, "40%", string(got.Progress), "nothing was written")

	q := realQueue(t, nil)
	_, err = q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	errs := make(chan error, 1)
	startWork(t, q, HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		errs <- SetProgress(hctx, make([]byte, MaxProgressBytes+1))
		return nil, nil
	}), nil)
	require.ErrorIs(t, <-errs, ErrInvalid)
}
