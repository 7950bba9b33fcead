package asynqcompat

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// A held jobkey job whose hold's mark cannot be read is reported and kept
// held, and the migration moves the other jobs: one forged mark never
// stops every run of the migration.
func TestMigrateToAsynqKeepsAHoldWithAnUnreadableMarkAndMovesTheRest(t *testing.T) {
	t.Parallel()
	for _, mark := range []string{"garbage", "", "-0001-01-01T00:00:00Z", "10000-01-01T00:00:00Z"} {
		e := newEnv(t)
		q := e.queue(t, "emails", nil)
		_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil,
			Meta: map[string]string{metaHeldRunAt: mark}})
		require.NoError(t, err)
		_, err = q.Enqueue(e.ctx, moveType, []byte("y"), &jobkey.EnqueueOpts{ID: "y"})
		require.NoError(t, err)
		rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
		require.NoError(t, err, "mark %q", mark)
		require.Equal(t, 1, rep.Moved, "mark %q: %+v", mark, rep)
		j, err := q.Get(e.ctx, "x")
		require.NoError(t, err, "kept")
		require.True(t, j.RunAt.Equal(holdUntil), "kept held")
		require.Equal(t, mark, j.Meta[metaHeldRunAt], "its mark kept")
		var found bool
		for _, n := range rep.Skipped {
			found = found || n.ID == "x"
		}
		require.True(t, found, "mark %q: reported: %+v", mark, rep)
		_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
		require.Error(t, err, "not in asynq")
	}
}

// A held job whose mark gives a RunAt far in the past or far in the future
// is moved once, due no earlier than the mark says, and no panic.
func TestMigrateToAsynqReleasesAHoldWithAnExtremeMark(t *testing.T) {
	t.Parallel()
	for _, at := range []time.Time{time.Time{}, time.Unix(-1<<40, 0).UTC(), holdUntil, time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)} {
		e := newEnv(t)
		q := e.queue(t, "emails", nil)
		_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x", RunAt: holdUntil,
			Meta: map[string]string{metaHeldRunAt: at.Format(time.RFC3339Nano)}})
		require.NoError(t, err)
		rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
		t.Logf("mark %v: %+v %v", at, rep, err)
		j, jerr := q.Get(e.ctx, "x")
		ti, aerr := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
		switch {
		case jerr == nil && aerr == nil:
			t.Fatalf("mark %v: in both: %+v / %+v", at, j, ti)
		case jerr != nil && aerr != nil:
			t.Fatalf("mark %v: lost: %v / %v", at, jerr, aerr)
		case aerr == nil:
			require.False(t, ti.NextProcessAt.Before(at.Truncate(time.Second)) && at.After(time.Now()), "mark %v: due at %v", at, ti.NextProcessAt)
		}
	}
}

// A user's Meta entry under the hold's mark key is the user's: a job
// that holds it moves no differently from one with any other own Meta.
func TestMigrateToAsynqKeepsAUsersEntryUnderTheHoldMarkKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	_, err := q.Enqueue(e.ctx, moveType, []byte("x"), &jobkey.EnqueueOpts{ID: "x",
		Meta: map[string]string{metaHeldRunAt: "mine"}})
	require.NoError(t, err)
	rep, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: moveType})
	require.NoError(t, err)
	require.Zero(t, rep.Moved, "%+v", rep)
	require.Len(t, rep.Skipped, 1, "%+v", rep)
	j, err := q.Get(e.ctx, "x")
	require.NoError(t, err, "kept in jobkey")
	require.Equal(t, "mine", j.Meta[metaHeldRunAt], "its Meta kept")
	_, err = asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo("default", "x")
	require.Error(t, err, "not in asynq")
}
