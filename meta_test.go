package jobkey

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Meta goes in with Enqueue and EnqueueMany, is copied from the caller's
// map, comes back from Get, and is refused beyond its limits before
// anything is written.
func TestEnqueueMeta(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	meta := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "m", Meta: meta})
	require.NoError(t, err)
	meta["traceparent"] = "changed by the caller afterwards"
	got, err := f.q.Get(f.ctx, "m")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, got.Meta)
	require.Equal(t, j, got)

	jobs, err := f.q.EnqueueMany(f.ctx, []JobSpec{
		{Type: "t", Opts: &EnqueueOpts{ID: "a", Meta: map[string]string{"k": "a"}}},
		{Type: "t", Opts: &EnqueueOpts{ID: "b"}},
		{Type: "t", Opts: &EnqueueOpts{ID: "c", Meta: map[string]string{}}},
	})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k": "a"}, jobs[0].Meta)
	for _, id := range []string{"b", "c"} {
		got, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Nil(t, got.Meta, id)
	}

	tooMany := map[string]string{}
	for i := range MaxMetaEntries + 1 {
		tooMany[strings.Repeat("k", i+1)] = ""
	}
	bad := map[string]map[string]string{
		"emptyKey": {"": "v"},
		"tooMany":  tooMany,
		"tooLarge": {"k": strings.Repeat("v", MaxMetaBytes)},
	}
	for name, m := range bad {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "bad-" + name, Meta: m})
		require.ErrorIs(t, err, ErrInvalid, name)
		_, err = f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "ok-" + name}},
			{Type: "t", Opts: &EnqueueOpts{ID: "bad-" + name, Meta: m}}})
		require.ErrorIs(t, err, ErrInvalid, name)
		for _, id := range []string{"ok-" + name, "bad-" + name} {
			_, err := f.q.Get(f.ctx, id)
			require.ErrorIs(t, err, ErrNotFound, "a bad Meta refuses the whole batch")
		}
	}
}

// Update edits Meta and refuses a bad one; claims, completions and
// failures keep it.
func TestUpdateMetaAndTransitionsKeepIt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "u", Meta: map[string]string{"a": "1"}})
	require.NoError(t, err)
	u, err := f.q.Update(f.ctx, "u", func(j *Job) error {
		j.Meta["b"] = "2"
		delete(j.Meta, "a")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"b": "2"}, u.Meta)
	_, err = f.q.Update(f.ctx, "u", func(j *Job) error { j.Meta[""] = "x"; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.q.Update(f.ctx, "u", func(j *Job) error { j.Meta["big"] = strings.Repeat("x", MaxMetaBytes); return nil })
	require.ErrorIs(t, err, ErrInvalid)

	want := map[string]string{"b": "2"}
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, want, c.Meta)
	_, err = f.q.Fail(f.ctx, c, context.DeadlineExceeded)
	require.NoError(t, err)
	_, err = f.q.Update(f.ctx, "u", func(j *Job) error { j.RunAt = f.clock.Now(); return nil })
	require.NoError(t, err)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	done, err := f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err)
	require.Equal(t, want, done.Meta)
	got, err := f.q.Get(f.ctx, "u")
	require.NoError(t, err)
	require.Equal(t, want, got.Meta)
	require.Equal(t, StateSucceeded, got.State)
}

// A handler gets its own copy of Meta: what it changes is not written back.
func TestWorkHandlerMetaIsACopy(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "h", Meta: map[string]string{"k": "v"}})
	require.NoError(t, err)
	seen := make(chan map[string]string, 1)
	startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		seen <- map[string]string{"k": j.Meta["k"]}
		j.Meta["k"] = "changed by the handler"
		return nil, nil
	}), nil)
	require.Equal(t, map[string]string{"k": "v"}, <-seen)
	waitFor(t, "succeeded", func() bool {
		j, err := q.Get(ctx, "h")
		require.NoError(t, err)
		return j.State == StateSucceeded
	})
	j, err := q.Get(ctx, "h")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k": "v"}, j.Meta)

	// The worker's own copy, which it encodes while the handler runs (the
	// fused claim, a retried outcome write), is not the handler's.
	w := &worker{h: HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		j.Meta["k"] = "changed by the handler"
		return nil, nil
	})}
	mine := &Job{Meta: map[string]string{"k": "v"}}
	_, err = w.call(ctx, mine)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k": "v"}, mine.Meta)
}
