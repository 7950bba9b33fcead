package main

import (
	"encoding/json"
	"testing"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

func TestBatchesAndBatchShowProgress(t *testing.T) {
	f := newFixture(t, 2)
	f.enqueue("other", nil)
	out, err := f.run("batches")
	require.NoError(t, err)
	require.Equal(t, "no batches\n", out)
	jobs := []jobkey.JobSpec{{Type: "resize"}, {Type: "resize"}, {Type: "resize"}}
	b, ids, err := f.q.EnqueueBatch(f.ctx, jobs, jobkey.JobSpec{Type: "album"}, &jobkey.BatchOpts{ID: "album-7", Condition: jobkey.BatchAllSucceeded})
	require.NoError(t, err)
	out, err = f.run("show", ids[0])
	require.NoError(t, err)
	require.Contains(t, out, "batch:        album-7 (jobkey batch -queue mail album-7)\n", "a job's page names its batch")
	out, err = f.run("show", ids[0], "-json")
	require.NoError(t, err)
	require.Contains(t, out, `"batch": "album-7"`)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	if j.Type == "other" {
		j, err = f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
	}
	_, err = f.q.Complete(f.ctx, j, nil)
	require.NoError(t, err)

	out, err = f.run("batches")
	require.NoError(t, err)
	require.Contains(t, out, "PROGRESS")
	require.Regexp(t, `album-7 +album +1/3 +2 +1 +0 +0 +succeeded +waiting`, out)

	out, err = f.run("batches", "-json")
	require.NoError(t, err)
	var doc struct {
		Batches []batchView `json:"batches"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc.Batches, 1)
	require.Equal(t, batchView{ID: b.ID, Total: 3, Pending: 2, Succeeded: 1, Condition: "succeeded", Callback: "album", Fired: "waiting",
		CreatedAt: doc.Batches[0].CreatedAt}, doc.Batches[0])

	out, err = f.run("batch", "album-7")
	require.NoError(t, err)
	require.Contains(t, out, "progress:     1/3 finished\n")
	require.Contains(t, out, "waits for:    all succeeded\n")
	require.Contains(t, out, "callback:     album (job album-7)\n")
	require.Contains(t, out, "fired:        waiting\n")

	_, err = f.run("batch", "nope")
	require.ErrorIs(t, err, jobkey.ErrBatchNotFound)
	_, err = f.run("batch")
	require.Error(t, err)
}

// The command show suggests for a job's batch runs that batch when pasted
// into a shell, whatever its ID holds: never a second command, never a
// flag.
func TestShowSuggestsABatchCommandThatAShellRunsAsIs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	for id, want := range map[string]string{
		"x; touch pwned $(id) `id` 'q'": `jobkey batch -queue mail 'x; touch pwned $(id) ` + "`id`" + ` '"'"'q'"'"''`,
		"-redis=redis://evil:1":         `jobkey batch -queue mail -- -redis=redis://evil:1`,
		"plain-7":                       `jobkey batch -queue mail plain-7`,
	} {
		_, ids, err := f.q.EnqueueBatch(f.ctx, []jobkey.JobSpec{{Type: "t"}}, jobkey.JobSpec{Type: "cb"}, &jobkey.BatchOpts{ID: id})
		require.NoError(t, err)
		out, err := f.run("show", ids[0])
		require.NoError(t, err)
		require.Contains(t, out, "("+want+")\n", id)
	}
}
