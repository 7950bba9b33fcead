package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// commandArgs are, for every command, the arguments that get it past its
// own checks to the point where it connects: the flag given twice must
// be refused before that.
var commandArgs = map[string][]string{
	"bench":            {"-scenarios", "lifecycle"},
	"demo":             {},
	"stats":            {"-queue", "q"},
	"verify":           {"-queue", "q"},
	"ui":               {"-addr", "127.0.0.1:0"},
	"ls":               {"-queue", "q", "-state", "pending"},
	"show":             {"-queue", "q", "id"},
	"retry":            {"-queue", "q", "id"},
	"cancel":           {"-queue", "q", "id"},
	"delete":           {"-queue", "q", "id"},
	"pause":            {"-queue", "q"},
	"resume":           {"-queue", "q"},
	"queues":           {},
	"limit":            {"-queue", "q", "key"},
	"workers":          {"-queue", "q"},
	"schedules":        {"-queue", "q"},
	"batches":          {"-queue", "q"},
	"batch":            {"-queue", "q", "id"},
	"events":           {"-queue", "q"},
	"migrate-asynq":    {"-type", "t", "-to", "q"},
	"migrate-to-asynq": {"-type", "t", "-from", "q"},
}

// Every command refuses a flag given twice, before it connects: the last
// one used to win, silently.
func TestEveryCommandRefusesARepeatedFlag(t *testing.T) {
	require.Len(t, commandArgs, len(jobCommands)+7, "every command is listed")
	for cmd, args := range commandArgs {
		var out, errOut bytes.Buffer
		all := append([]string{cmd, "-redis", "redis://127.0.0.1:1", "-redis", "redis://127.0.0.1:2"}, args...)
		err := run(context.Background(), all, &out, &errOut)
		require.Error(t, err, cmd)
		require.Contains(t, err.Error(), "-redis is given twice: give each flag once", cmd)
		require.NotContains(t, err.Error(), "could not be reached", "%s: refused before connecting", cmd)
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"cancel", "-redis", "redis://127.0.0.1:1", "-queue", "q", "-all", "-yes", "-yes"}, &out, &errOut)
	require.ErrorContains(t, err, "-yes is given twice", "a bool flag too")
}

// `delete -queue a x1 -queue b x2` deleted x1 from queue b. It is refused,
// and neither queue loses a job.
func TestDeleteWithTwoQueuesDeletesNothing(t *testing.T) {
	f := newFixture(t, 2)
	other, err := jobkey.NewQueue(f.rdb, "other", &jobkey.Config{Prefix: f.prefix, Shards: 2})
	require.NoError(t, err)
	for _, q := range []*jobkey.Queue{f.q, other} {
		for _, id := range []string{"x1", "x2"} {
			_, err := q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ID: id})
			require.NoError(t, err)
		}
	}
	var out, errOut bytes.Buffer
	err = run(f.ctx, []string{"delete", "-redis", f.url, "-prefix", f.prefix, "-queue", "mail", "x1", "-queue", "other", "x2"}, &out, &errOut)
	require.ErrorContains(t, err, "-queue is given twice")
	for _, q := range []*jobkey.Queue{f.q, other} {
		for _, id := range []string{"x1", "x2"} {
			_, err := q.Get(f.ctx, id)
			require.NoError(t, err, "%s of %s is still there", id, q.Name())
		}
	}
}

// A command's usage (-h) prints every flag with its default, not the
// flag package's "panic calling String method" for a repeat-refusing flag.
func TestUsagePrintsEveryFlagsDefault(t *testing.T) {
	var out, errOut bytes.Buffer
	_ = run(context.Background(), []string{"bench", "-h"}, &out, &errOut)
	require.NotContains(t, errOut.String(), "panic")
	require.Contains(t, errOut.String(), "(default 20000)", "-worker-jobs")
	require.Contains(t, errOut.String(), "(default report)", "-out")
	require.NotContains(t, errOut.String(), "(default 0)", "a zero default is left out")
	require.NotContains(t, errOut.String(), "(default false)")
}
