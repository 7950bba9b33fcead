package jobkey

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"

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

// Regression, found in review: recoverClaims looks for the claim of a fused
// EXEC whose reply was lost with one Get, at once, on the flush's context,
// and gives up when that read fails ("as after a crashed worker"). But an
// unknown outcome mostly comes from a slow or broken link, and the Get goes
// over the same link a moment later: here the link is slow for half a
// second (longer than the client's read timeout) while the EXEC goes out.
// The EXEC lands, the reply comes too late, the Get times out as well, and
// the claim is stranded as before the fix: nothing crashed, the retried
// completion recognises its own write (it retries until its lease is
// over), but the claim gets one look. On its last attempt (MaxAttempts 1)
// the job then fails for good without ever running. The slot now looks
// for the claim itself, retrying while the claim's lease may hold (here the
// lease outlasts the slow episode). A link down for longer than the lease
// still spends the attempt, as it does for a plain Claim whose reply is
// lost: the lease has run out, and nobody can tell a run from none.
func TestSlowFusedReplyDoesNotFailUnrunJob(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	const lease = 2 * time.Second       // the link recovers within it
	const slow = 300 * time.Millisecond // > the proxied client's 200 ms read timeout
	var slowExec atomic.Bool
	cut.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if slowExec.Load() && slices.Contains(names(cmds), "exec") {
			proxy.Set(faultproxy.Faults{Latency: slow}) // the link slows down as the EXEC goes out
		}
		return nil
	}))
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: lease, Logger: quietLog()})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, MaxAttempts: 1})
		require.NoError(t, err)
	}
	first, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	other := "b"
	if first.ID == "b" {
		other = "a"
	}
	slowExec.Store(true)
	asked := time.Now()
	out, err := q.completeAndClaim(ctx, first, []byte("r"), "w")
	slowExec.Store(false)
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC was sent; its reply came too late")
	require.NotNil(t, out.unsure)
	found := make(chan *Job, 1)
	go func() { found <- (&worker{q: q}).findClaim(ctx, out.unsure, asked) }() // as the slot does
	time.Sleep(2 * slow)                                                       // the slow episode ends; the lookup keeps trying meanwhile
	proxy.Set(faultproxy.Faults{})
	_, err = q.Complete(ctx, first, []byte("r")) // as Work's record does, with retries
	require.NoError(t, err, "the retried completion recognises its own write")
	next := <-found
	stored, err := q.Get(ctx, other)
	require.NoError(t, err)
	t.Logf("after the fused call: %s is %s, attempt %d/%d, owner %q; handed to the slot: %v",
		other, stored.State, stored.Attempt, stored.MaxAttempts, stored.LeaseOwner, next != nil)
	require.NotNil(t, next, "found once the link recovered, within the claim's lease")
	require.Equal(t, other, next.ID)
	_, err = q.Complete(ctx, next, nil)
	require.NoError(t, err, "the slot runs it and completes it: it never fails unrun")
}
