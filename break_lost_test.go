package jobkey

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// BREAK: Work's outcome write is retried after an ambiguous error, but only
// Complete recognises its own earlier landing. A Fail (or Release) whose
// EXEC ran and whose reply was lost is retried, finds the job no longer
// active under its token, and is reported as failed with ErrLeaseLost:
// OnRecorded (and the log) say "not written" for a write that landed.
func TestBreakWorkReportsLandedFailAsLost(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: 10 * time.Second, MaxAttempts: 5})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	type rec struct {
		j   *Job
		err error
	}
	recs := make(chan rec, 4)
	running, fail := make(chan struct{}), make(chan struct{})
	var once sync.Once
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
		once.Do(func() { close(running) })
		<-fail
		return nil, errors.New("handler failed")
	}), &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) { recs <- rec{j, err} }})
	<-running
	proxy.Set(faultproxy.Faults{ExecCutProb: 1}) // the next EXEC (the Fail) runs, its reply is lost
	close(fail)
	var r rec
	select {
	case r = <-recs:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing recorded")
	}
	proxy.Set(faultproxy.Faults{})
	stored, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	t.Logf("OnRecorded err: %v; stored: %s, LastError %q, exec cuts %d", r.err, stored.State, stored.LastError, proxy.Counts().ExecCuts)
	require.Equal(t, "handler failed", stored.LastError, "precondition: the Fail landed")
	require.NoError(t, r.err, "the Fail landed, but Work reported it as not written")
}
