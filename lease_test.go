package jobkey

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every claim fences with a token of its own: after Claim, Cancel, Retry
// and a new Claim by the same worker name (replicas sharing a fixed
// WorkOpts.Name), the first copy's Attempt and LeaseOwner match the stored
// job again, and its writes are still refused (issue 9, item 5).
func TestFencingSurvivesRepeatedAttemptAndOwner(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	first, err := f.q.Claim(f.ctx, "replica")
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, j.ID)
	require.NoError(t, err)
	r, err := f.q.Retry(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, first.LeaseUntil, r.RunAt, "due when the canceled run's lease would have ended")
	f.clock.Advance(31 * time.Second)
	second, err := f.q.Claim(f.ctx, "replica")
	require.NoError(t, err)
	require.Equal(t, first.Attempt, second.Attempt)
	require.Equal(t, first.LeaseOwner, second.LeaseOwner)
	require.NotEqual(t, first.LeaseToken, second.LeaseToken)

	for name, write := range map[string]func(*Job) (*Job, error){
		"Complete": func(j *Job) (*Job, error) { return f.q.Complete(f.ctx, j, []byte("stale")) },
		"Extend":   func(j *Job) (*Job, error) { return f.q.Extend(f.ctx, j) },
		"Fail":     func(j *Job) (*Job, error) { return f.q.Fail(f.ctx, j, nil) },
		"Release":  func(j *Job) (*Job, error) { return f.q.Release(f.ctx, j) },
	} {
		_, err := write(first)
		require.ErrorIs(t, err, ErrLeaseLost, name)
	}
	done, err := f.q.Complete(f.ctx, second, []byte("fresh"))
	require.NoError(t, err)
	require.Equal(t, []byte("fresh"), done.Result)
	again, err := f.q.Complete(f.ctx, second, []byte("fresh"))
	require.NoError(t, err, "a Complete retried after a lost reply sees its own completion")
	require.Equal(t, done.Rev, again.Rev)
	_, err = f.q.Complete(f.ctx, first, []byte("stale"))
	require.ErrorIs(t, err, ErrLeaseLost, "and not the other claim's")
}
