package jobkey

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	p, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "p"})
	require.NoError(t, err)
	c, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, c.State)
	f.requireIndexed(t, c)
	again, err := f.q.Cancel(f.ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, c.Rev, again.Rev, "canceling twice writes nothing")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	ca, err := f.q.Cancel(f.ctx, a.ID)
	require.NoError(t, err)
	f.requireIndexed(t, ca)
	_, err = f.q.Complete(f.ctx, a, nil)
	require.ErrorIs(t, err, ErrLeaseLost, "the canceled job's worker is fenced off")

	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "s"})
	require.NoError(t, err)
	s, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, s, nil)
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, "s")
	var se *StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, StateSucceeded, se.State)
	_, err = f.q.Retry(f.ctx, "s")
	require.ErrorAs(t, err, &se)
	_, err = f.q.Cancel(f.ctx, "missing")
	require.ErrorIs(t, err, ErrNotFound)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 1, Canceled: 2}, st)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{Delay: time.Hour})
	require.NoError(t, err)
	u, err := f.q.Update(f.ctx, j.ID, func(cur *Job) error {
		cur.Payload = []byte("v2")
		cur.RunAt = f.clock.Now()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []byte("v2"), u.Payload)
	require.EqualValues(t, 2, u.Rev)
	f.requireIndexed(t, u)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "the new RunAt made it due")
	require.Equal(t, []byte("v2"), c.Payload)

	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.State = StateSucceeded; return nil })
	require.ErrorContains(t, err, "may not change State")
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { return errors.New("changed my mind") })
	require.EqualError(t, err, "changed my mind")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, c, got, "refused edits wrote nothing")
}

// A plan that writes an index nobody predicted pays one more round trip of
// TYPE checks under the WATCH; a wrong type found there refuses the write.
func TestLateTypeCheckRefusesBeforeWrite(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("v1"), &EnqueueOpts{ID: "late", Delay: time.Hour})
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.Del(f.ctx, keys.Ready).Err())
	require.NoError(t, f.rdb.Set(f.ctx, keys.Ready, "not a zset", 0).Err())
	before := f.rdb.Get(f.ctx, keys.Job).Val()

	f.hook.Reset()
	_, err = f.q.Update(f.ctx, j.ID, func(cur *Job) error { cur.RunAt = f.clock.Now(); return nil })
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, keys.Ready, wt.Key)
	require.EqualValues(t, 3, f.hook.RTT.Load(), "WATCH+GET, late TYPE, UNWATCH")
	require.Equal(t, before, f.rdb.Get(f.ctx, keys.Job).Val(), "the value is as it was")
	require.Equal(t, "not a zset", f.rdb.Get(f.ctx, keys.Ready).Val())
}
