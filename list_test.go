package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// listAll pages through a listing with the given limit and returns every
// job ID in order, with the unreadable IDs.
func listAll(t *testing.T, f *fixture, o ListOpts, between func(page int)) (ids, bad []string) {
	t.Helper()
	for page := 0; ; page++ {
		p, err := f.q.List(f.ctx, o)
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Jobs)+len(p.Unreadable), cmp.Or(o.Limit, DefaultListLimit))
		for _, j := range p.Jobs {
			ids = append(ids, j.ID)
		}
		for _, u := range p.Unreadable {
			bad = append(bad, u.ID)
		}
		if p.Next == "" {
			return ids, bad
		}
		require.Less(t, page, 10000, "the listing never ends")
		if between != nil {
			between(page)
		}
		o.Cursor = p.Next
	}
}

// Pending jobs come by RunAt over 4 shards, ties by ID, each once, however
// small the pages; jobs that come and go meanwhile do not make the ones
// that stay appear twice or not at all.
func TestListPendingInOrderAcrossShards(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	base := f.clock.Now()
	var want []*Job
	for i := range 120 {
		// Many share a millisecond: ties are where keyset paging slips.
		at := base.Add(time.Duration(i%5) * time.Second)
		j, err := f.q.Enqueue(f.ctx, []string{"a", "b"}[i%2], nil, &EnqueueOpts{RunAt: at})
		require.NoError(t, err)
		want = append(want, j)
	}
	order := func(a, b *Job) int { return cmp.Or(a.RunAt.Compare(b.RunAt), strings.Compare(a.ID, b.ID)) }
	slices.SortFunc(want, order)
	var wantIDs []string
	for _, j := range want {
		wantIDs = append(wantIDs, j.ID)
	}
	for _, limit := range []int{1, 7, 100, 1000} {
		got, bad := listAll(t, f, ListOpts{State: StatePending, Limit: limit}, nil)
		require.Empty(t, bad)
		require.Equal(t, wantIDs, got, "limit %d", limit)
	}

	// While someone pages, others enqueue and cancel: every job that stays
	// pending is listed exactly once.
	canceled := map[string]bool{}
	got, _ := listAll(t, f, ListOpts{State: StatePending, Limit: 9}, func(page int) {
		_, err := f.q.Enqueue(f.ctx, "a", nil, &EnqueueOpts{RunAt: base.Add(time.Duration(page%7) * time.Second)})
		require.NoError(t, err)
		victim := want[len(want)-1-page]
		if _, err := f.q.Cancel(f.ctx, victim.ID); err == nil {
			canceled[victim.ID] = true
		}
	})
	count := map[string]int{}
	for _, id := range got {
		count[id]++
	}
	for _, j := range want {
		if !canceled[j.ID] {
			require.Equal(t, 1, count[j.ID], "job %s stayed pending and must be listed once", j.ID)
		}
	}
	for id, n := range count {
		require.Equal(t, 1, n, "job %s listed %d times", id, n)
	}

	// The type filter.
	got, _ = listAll(t, f, ListOpts{State: StatePending, Type: "b", Limit: 5}, nil)
	for _, id := range got {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, "b", j.Type)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	all, _ := listAll(t, f, ListOpts{State: StatePending}, nil)
	require.Len(t, all, int(st.Pending))
}

// Finished jobs come newest first; active ones by lease deadline.
func TestListFinishedNewestFirst(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	var done []string
	for i := range 12 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
		done = append(done, c.ID)
		if i%3 == 0 {
			f.clock.Advance(time.Second)
		}
	}
	got, _ := listAll(t, f, ListOpts{State: StateSucceeded, Limit: 5}, nil)
	require.ElementsMatch(t, done, got)
	var prev *Job
	for _, id := range got {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		if prev != nil {
			require.False(t, j.UpdatedAt.After(prev.UpdatedAt), "newest first")
		}
		prev = j
	}

	for range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
		_, err = f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		f.clock.Advance(time.Second)
	}
	active, _ := listAll(t, f, ListOpts{State: StateActive, Limit: 3}, nil)
	require.Len(t, active, 4)
	prev = nil
	for _, id := range active {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, StateActive, j.State)
		if prev != nil {
			require.True(t, j.LeaseUntil.After(prev.LeaseUntil), "soonest deadline first")
		}
		prev = j
	}
}

// A value that cannot be read is listed as such; the page does not fail,
// and the bytes stay.
func TestListReportsUnreadable(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ok, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	bad, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	key, _ := f.q.ks.jobKeyOf(bad.ID)
	require.NoError(t, f.rdb.Set(f.ctx, key, "junk", 0).Err())
	other, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	okey, _ := f.q.ks.jobKeyOf(other.ID)
	require.NoError(t, f.rdb.Del(f.ctx, okey).Err())
	require.NoError(t, f.rdb.RPush(f.ctx, okey, "x").Err())

	p, err := f.q.List(f.ctx, ListOpts{State: StatePending})
	require.NoError(t, err)
	require.Len(t, p.Jobs, 1)
	require.Equal(t, ok.ID, p.Jobs[0].ID)
	require.Len(t, p.Unreadable, 2)
	errs := map[string]error{}
	for _, u := range p.Unreadable {
		errs[u.ID] = u.Err
	}
	require.ErrorIs(t, errs[bad.ID], ErrCorrupt)
	require.ErrorIs(t, errs[other.ID], ErrWrongType)
	raw, err := f.rdb.Get(f.ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "junk", raw, "listing never touches a value")

	// The corrupt index, once a claimer set them aside.
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	p, err = f.q.List(f.ctx, ListOpts{Corrupt: true})
	require.NoError(t, err)
	require.Len(t, p.Unreadable, 2)
}

func TestListRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, o := range []ListOpts{
		{}, {State: 9}, {State: StatePending, Limit: -1}, {State: StatePending, Limit: MaxListLimit + 1},
		{State: StatePending, Cursor: "%%%"}, {State: StatePending, Type: strings.Repeat("t", MaxTypeLen+1)},
	} {
		_, err := f.q.List(f.ctx, o)
		require.ErrorIs(t, err, ErrInvalid, "%+v", o)
	}
	for range 3 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	p, err := f.q.List(f.ctx, ListOpts{State: StatePending, Limit: 1})
	require.NoError(t, err)
	require.NotEmpty(t, p.Next)
	_, err = f.q.List(f.ctx, ListOpts{State: StateFailed, Cursor: p.Next})
	require.ErrorIs(t, err, ErrInvalid, "a cursor of another listing")
}

// Delete removes a pending or finished job with its entry; it refuses an
// active job, a missing one and an unreadable value, and changes nothing.
func TestDelete(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	p, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	a, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "active"})
	require.NoError(t, err)
	_ = a
	require.NoError(t, f.q.Delete(f.ctx, p.ID))
	_, err = f.q.Get(f.ctx, p.ID)
	require.ErrorIs(t, err, ErrNotFound)
	idx, _ := f.indexOf(t, p.ID)
	require.Empty(t, idx, "its entry went with it")

	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	before, err := f.rdb.Get(f.ctx, f.q.ks.jobKey(0, c.ID)).Result()
	require.NoError(t, err)
	err = f.q.Delete(f.ctx, c.ID)
	var se *StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, StateActive, se.State)
	after, err := f.rdb.Get(f.ctx, f.q.ks.jobKey(0, c.ID)).Result()
	require.NoError(t, err)
	require.Equal(t, before, after, "an active job stays untouched")
	f.requireIndexed(t, c)

	_, err = f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err)
	require.NoError(t, f.q.Delete(f.ctx, c.ID), "a finished job")
	idx, _ = f.indexOf(t, c.ID)
	require.Empty(t, idx)

	// DeleteIn deletes only from the state named.
	d, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	err = f.q.DeleteIn(f.ctx, d.ID, StateSucceeded)
	require.ErrorAs(t, err, &se)
	require.Equal(t, StatePending, se.State)
	f.requireIndexed(t, d)
	require.NoError(t, f.q.DeleteIn(f.ctx, d.ID, StatePending))
	_, err = f.q.Get(f.ctx, d.ID)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, f.q.DeleteIn(f.ctx, d.ID, 0), ErrInvalid)

	require.ErrorIs(t, f.q.Delete(f.ctx, "nope"), ErrNotFound)
	require.ErrorIs(t, f.q.Delete(f.ctx, "bad{id"), ErrInvalid)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.jobKey(0, "junk"), "junk", 0).Err())
	require.ErrorIs(t, f.q.Delete(f.ctx, "junk"), ErrCorrupt)
	require.Equal(t, int64(1), f.rdb.Exists(f.ctx, f.q.ks.jobKey(0, "junk")).Val(), "unreadable bytes are kept")
}

// failJobs enqueues n jobs of each type that fail for good.
func failJobs(t *testing.T, f *fixture, n int, types ...string) {
	t.Helper()
	for _, typ := range types {
		for range n {
			_, err := f.q.Enqueue(f.ctx, typ, nil, &EnqueueOpts{MaxAttempts: 1})
			require.NoError(t, err)
		}
	}
	for {
		c, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return
		}
		require.NoError(t, err)
		_, err = f.q.Fail(f.ctx, c, errors.New("boom"))
		require.NoError(t, err)
	}
}

// Bulk actions count what they did, by type, and leave the indexes true.
func TestBulkActions(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4, MaxBatch: 16})
	failJobs(t, f, 30, "a", "b")
	res, err := f.q.RetryFailed(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, BulkResult{Done: 30}, res)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(30), st.Pending)
	require.Equal(t, int64(30), st.Failed)

	res, err = f.q.CancelPending(f.ctx, "b")
	require.NoError(t, err)
	require.Equal(t, 0, res.Done, "no pending job of type b")
	res, err = f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	require.Equal(t, 30, res.Done)

	res, err = f.q.DeleteFinished(f.ctx, StateFailed, "")
	require.NoError(t, err)
	require.Equal(t, 30, res.Done)
	res, err = f.q.DeleteFinished(f.ctx, StateCanceled, "a")
	require.NoError(t, err)
	require.Equal(t, 30, res.Done)
	st, err = f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
	_, err = f.q.DeleteFinished(f.ctx, StatePending, "")
	require.ErrorIs(t, err, ErrInvalid)
}

// CancelPending while workers claim: each job is either canceled or run,
// never both, and the counts add up.
func TestCancelPendingWhileWorking(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, MaxBatch: 32})
	const n = 400
	for range n {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	ran := map[string]bool{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for {
				c, err := f.q.Claim(f.ctx, fmt.Sprint("w", w))
				if errors.Is(err, ErrNoJob) {
					return
				}
				if !errors.Is(err, ErrConflict) {
					require.NoError(t, err)
				}
				if c == nil {
					continue
				}
				mu.Lock()
				ran[c.ID] = true
				mu.Unlock()
				_, err = f.q.Complete(f.ctx, c, nil)
				require.NoError(t, err)
			}
		})
	}
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	wg.Wait()
	canceled, _ := listAll(t, f, ListOpts{State: StateCanceled, Limit: MaxListLimit}, nil)
	succeeded, _ := listAll(t, f, ListOpts{State: StateSucceeded, Limit: MaxListLimit}, nil)
	require.Len(t, canceled, res.Done)
	require.Equal(t, n, len(canceled)+len(succeeded))
	for _, id := range canceled {
		require.False(t, ran[id], "job %s was canceled and ran", id)
	}
	require.Len(t, ran, len(succeeded))
	t.Logf("canceled %d, ran %d, skipped %d", res.Done, len(ran), res.Skipped)
}

// List with a Type filter returns a full first page when more than a page of
// jobs share one millisecond. Ties of hundreds are ordinary: a group commit
// finishes MaxBatch jobs at one Redis time, and EnqueueMany with one RunAt
// schedules a batch at one millisecond. A listing that re-read the tied
// millisecond one entry per round trip would give up with no page at all.
// Here 150 pending jobs share one RunAt, one of them of another type, and
// the page of type a holds 100 jobs.
func TestListTypeFilterPagesThroughTiedMillisecond(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1})
	at := f.clock.Now()
	var specs []JobSpec
	for i := range 150 {
		typ := "a"
		if i == 50 {
			typ = "b"
		}
		specs = append(specs, JobSpec{Type: typ, Opts: &EnqueueOpts{RunAt: at}})
	}
	_, err := f.q.EnqueueMany(f.ctx, specs)
	require.NoError(t, err)
	f.hook.Reset()
	p, err := f.q.List(f.ctx, ListOpts{State: StatePending, Type: "a"})
	t.Logf("round trips of the failed page: %d", f.hook.RTT.Load())
	require.NoError(t, err, "a page of 100 jobs of type a out of 149")
	require.Len(t, p.Jobs, 100)
}

// sparseQueue enqueues n pending jobs of type "welcome", one a millisecond
// apart, but those at the positions in digests, of type "digest"; it
// returns the digests' IDs in listing order.
func sparseQueue(t *testing.T, f *fixture, n int, digests ...int) []string {
	t.Helper()
	base := f.clock.Now()
	var specs []JobSpec
	for i := range n {
		typ := "welcome"
		if slices.Contains(digests, i) {
			typ = "digest"
		}
		specs = append(specs, JobSpec{Type: typ, Opts: &EnqueueOpts{RunAt: base.Add(time.Duration(i) * time.Millisecond)}})
	}
	var ids []string
	for c := range slices.Chunk(specs, 256) {
		jobs, err := f.q.EnqueueMany(f.ctx, c)
		require.NoError(t, err)
		for _, j := range jobs {
			if j.Type == "digest" {
				ids = append(ids, j.ID)
			}
		}
	}
	return ids
}

// A page filtered by a rare type reads on until it holds Limit jobs, up
// to its bound of entries: here 15 digests among 1,500 jobs, one in 100,
// and pages of 10. The first page holds 10, not the one digest of its
// first 100 entries.
func TestListWithASparseTypeFillsThePage(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	var at []int
	for i := 50; i < 1500; i += 100 {
		at = append(at, i)
	}
	digests := sparseQueue(t, f, 1500, at...)
	f.hook.Reset()
	p, err := f.q.List(f.ctx, ListOpts{State: StatePending, Type: "digest", Limit: 10})
	require.NoError(t, err)
	t.Logf("round trips of the first page: %d, entries read: %d", f.hook.RTT.Load(), p.Scanned)
	require.Len(t, p.Jobs, 10)
	require.NotEmpty(t, p.Next)
	require.False(t, p.ScanStopped)
	p2, err := f.q.List(f.ctx, ListOpts{State: StatePending, Type: "digest", Limit: 10, Cursor: p.Next})
	require.NoError(t, err)
	require.Len(t, p2.Jobs, 5)
	require.Empty(t, p2.Next)
	var got []string
	for _, j := range append(p.Jobs, p2.Jobs...) {
		got = append(got, j.ID)
	}
	require.Equal(t, digests, got, "every digest, once, in order")
}

// A page whose type is rarer than its bound of entries (1,000 here) says
// that its scan stopped, and its cursor points after the last entry it
// read, not after the last job it listed: the next page reads on from
// there, so paging reaches the end instead of reading the same entries
// again. Here 3 digests among 2,500 jobs, at 0, 1,100 and 2,400.
func TestListSaysWhenItsScanStoppedEarly(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	digests := sparseQueue(t, f, 2500, 0, 1100, 2400)
	o := ListOpts{State: StatePending, Type: "digest", Limit: 5}
	var pages []*JobPage
	for len(pages) < 10 {
		p, err := f.q.List(f.ctx, o)
		require.NoError(t, err)
		pages = append(pages, p)
		if p.Next == "" {
			break
		}
		o.Cursor = p.Next
	}
	require.Len(t, pages, 3)
	for i, p := range pages[:2] {
		require.True(t, p.ScanStopped, "page %d", i)
		require.Equal(t, 1000, p.Scanned, "page %d", i)
		require.Len(t, p.Jobs, 1, "page %d", i)
		require.Equal(t, digests[i], p.Jobs[0].ID, "page %d", i)
	}
	last := pages[2]
	require.False(t, last.ScanStopped, "the last page read to the end")
	require.Equal(t, 500, last.Scanned)
	require.Len(t, last.Jobs, 1)
	require.Equal(t, digests[2], last.Jobs[0].ID)

	// A full page did not stop early, whatever it read.
	p, err := f.q.List(f.ctx, ListOpts{State: StatePending, Limit: 5})
	require.NoError(t, err)
	require.Len(t, p.Jobs, 5)
	require.False(t, p.ScanStopped)
	require.Equal(t, 5, p.Scanned)
}

// A job that stays pending is listed even when an entry before the cursor
// leaves the index (claimed, canceled, deleted) while a page is read. A page
// reads the ties of its cursor's millisecond in one command, with no offset:
// an offset shifts when an entry before it leaves, and would jump over the
// next job. Here 5 jobs share one RunAt, pages hold 2, and the first job is
// canceled while page 2 is read.
func TestListKeepsJobWhenEarlierEntryLeaves(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true})
	at := f.clock.Now()
	var ids []string
	for range 5 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{RunAt: at})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	p1, err := f.q.List(f.ctx, ListOpts{State: StatePending, Limit: 2})
	require.NoError(t, err)
	require.Len(t, p1.Jobs, 2)
	require.Equal(t, ids[:2], []string{p1.Jobs[0].ID, p1.Jobs[1].ID})

	other := queueOn(t, redistest.Client(t, nil), f.q.cfg.Prefix, Config{Shards: 1})
	var fired, offset atomic.Bool
	f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// A page reads the ties of its cursor's millisecond in one command,
		// with no offset. The change lands between the page's index read
		// and its read of the values, the one gap left.
		for _, c := range cmds {
			a := c.Args()
			for i := range a {
				if s, ok := a[i].(string); ok && c.Name() == "zrange" && strings.EqualFold(s, "limit") && a[i+1] != int64(0) {
					offset.Store(true) // an offset shifts when entries before it leave
				}
			}
		}
		if slices.ContainsFunc(names(cmds), func(n string) bool { return strings.HasPrefix(n, "mget") }) && fired.CompareAndSwap(false, true) {
			_, err := other.Cancel(context.Background(), ids[0])
			require.NoError(t, err)
		}
		return nil
	}))
	got := []string{p1.Jobs[0].ID, p1.Jobs[1].ID}
	o := ListOpts{State: StatePending, Limit: 2, Cursor: p1.Next}
	for o.Cursor != "" {
		p, err := f.q.List(f.ctx, o)
		require.NoError(t, err)
		for _, j := range p.Jobs {
			got = append(got, j.ID)
		}
		o.Cursor = p.Next
	}
	require.True(t, fired.Load())
	require.False(t, offset.Load(), "a page read its index by offset")
	require.Contains(t, got, ids[2], "job %s stayed pending throughout; listing was %v", ids[2], got)
}

// A page never lists a job twice, even when a job joins its cursor's
// millisecond before the cursor while the page is read. A re-read by offset
// would shift, and return again an entry the first read already kept. Here
// jobs a, b, c, d share one RunAt, page 1 is [a], and a job with a smaller
// ID is enqueued at that RunAt while page 2 is read: page 2 is [b c].
func TestListPageHoldsNoJobTwice(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true})
	at := f.clock.Now()
	for _, id := range []string{"a", "b", "c", "d"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, RunAt: at})
		require.NoError(t, err)
	}
	p1, err := f.q.List(f.ctx, ListOpts{State: StatePending, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, "a", p1.Jobs[0].ID)

	other := f.otherProcess(t, Config{Shards: 1})
	var fired atomic.Bool
	f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// The change lands between the index read and the values read of
		// page 2.
		if slices.ContainsFunc(names(cmds), func(n string) bool { return strings.HasPrefix(n, "mget") }) && fired.CompareAndSwap(false, true) {
			_, err := other.Enqueue(context.Background(), "t", nil, &EnqueueOpts{ID: "0", RunAt: at})
			require.NoError(t, err)
		}
		return nil
	}))
	p2, err := f.q.List(f.ctx, ListOpts{State: StatePending, Limit: 2, Cursor: p1.Next})
	require.NoError(t, err)
	require.True(t, fired.Load())
	var got []string
	for _, j := range p2.Jobs {
		got = append(got, j.ID)
	}
	require.Equal(t, []string{"b", "c"}, got)
}
