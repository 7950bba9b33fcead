package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestEnqueueAndGet(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	now := f.clock.Now()

	j, err := f.q.Enqueue(f.ctx, "email", []byte("hi"), nil)
	require.NoError(t, err)
	require.Len(t, j.ID, 26, "a ULID")
	require.Equal(t, StatePending, j.State)
	require.Equal(t, now, j.RunAt)
	require.EqualValues(t, 1, j.Rev)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, j, got)
	f.requireIndexed(t, j)

	d, err := f.q.Enqueue(f.ctx, "email", nil, &EnqueueOpts{ID: "later", Delay: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, now.Add(time.Minute), d.RunAt)
	require.Equal(t, 3, d.MaxAttempts)
	f.requireIndexed(t, d)

	at := now.Add(time.Hour)
	a, err := f.q.Enqueue(f.ctx, "email", nil, &EnqueueOpts{ID: "at", RunAt: at})
	require.NoError(t, err)
	require.Equal(t, at, a.RunAt)

	_, err = f.q.Get(f.ctx, "nope")
	require.ErrorIs(t, err, ErrNotFound)

	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Pending: 3, Due: 1, Scheduled: 2, DueByPriority: [MaxPriority + 1]int64{1}}, st)
}

func TestEnqueueIdempotentByID(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	first, err := f.q.Enqueue(f.ctx, "t", []byte("one"), &EnqueueOpts{ID: "same"})
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	again, err := f.q.Enqueue(f.ctx, "t", []byte("two"), &EnqueueOpts{ID: "same"})
	require.ErrorIs(t, err, ErrJobExists)
	var je *JobExistsError
	require.ErrorAs(t, err, &je)
	require.Equal(t, first, again, "the stored job comes back")
	got, err := f.q.Get(f.ctx, "same")
	require.NoError(t, err)
	require.Equal(t, []byte("one"), got.Payload, "nothing was written")
	require.EqualValues(t, 1, got.Rev)
}

func TestEnqueueRefusesBeforeWriting(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxValueBytes: 1024})
	cases := map[string]struct {
		typ     string
		payload []byte
		opts    *EnqueueOpts
		is      error
	}{
		"too large":    {"t", make([]byte, 2000), nil, ErrTooLarge},
		"empty type":   {"", nil, nil, nil},
		"long ID":      {"t", nil, &EnqueueOpts{ID: strings.Repeat("i", MaxIDLen+1)}, nil},
		"brace ID":     {"t", nil, &EnqueueOpts{ID: "a{b}"}, nil},
		"neg delay":    {"t", nil, &EnqueueOpts{Delay: -time.Second}, nil},
		"neg attempts": {"t", nil, &EnqueueOpts{MaxAttempts: -1}, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f.hook.Reset()
			_, err := f.q.Enqueue(f.ctx, c.typ, c.payload, c.opts)
			require.Error(t, err)
			if c.is != nil {
				require.ErrorIs(t, err, c.is)
			}
			require.Zero(t, f.hook.RTT.Load(), "refused before any Redis call")
		})
	}
	keys, err := f.rdb.Keys(f.ctx, f.q.cfg.Prefix+"*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{f.q.ks.metaKey()}, keys, "nothing but the queue's shard count, stored by the fixture's first call")
}

func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 4})
	_, err := f.q.Enqueue(f.ctx, "t", []byte("old"), &EnqueueOpts{ID: "x3"})
	require.NoError(t, err)
	var batch []JobSpec
	for i := range 10 {
		batch = append(batch, JobSpec{Type: "t", Payload: []byte{byte(i)}, Opts: &EnqueueOpts{ID: fmt.Sprintf("x%d", i)}})
	}
	batch = append(batch, JobSpec{Type: "t", Opts: &EnqueueOpts{ID: "x5"}}) // repeated within the batch
	f.hook.Reset()
	jobs, err := f.q.EnqueueMany(f.ctx, batch)
	require.ErrorIs(t, err, ErrJobExists)
	require.EqualValues(t, 6, f.hook.RTT.Load(), "11 jobs in batches of 4: three transactions of two round trips")
	require.Len(t, jobs, 11)
	require.Equal(t, []byte("old"), jobs[3].Payload, "the stored job is returned for a taken ID")
	require.Equal(t, []byte{5}, jobs[10].Payload, "a repeated ID returns the first of the batch")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, st.Pending)
	for _, j := range jobs {
		f.requireIndexed(t, j)
	}

	// A bad job anywhere refuses the whole batch before anything is written.
	_, err = f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "fine"}}, {Type: ""}})
	require.ErrorContains(t, err, "batch job 1")
	_, err = f.q.Get(f.ctx, "fine")
	require.ErrorIs(t, err, ErrNotFound)
}

// A huge EnqueueMany is cut into transactions of Config.MaxBatch jobs, so
// neither the client nor Redis ever holds one unbounded transaction.
func TestEnqueueManyIsChunked(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 500})
	batch := make([]JobSpec, 10_000)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Payload: []byte{byte(i)}}
	}
	before := f.q.Metrics()
	f.hook.Reset()
	jobs, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)
	require.Len(t, jobs, len(batch))
	require.EqualValues(t, 20, f.q.Metrics().Txns-before.Txns, "10,000 jobs in transactions of 500")
	require.EqualValues(t, 40, f.hook.RTT.Load())
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(batch), st.Pending)
}

// A batch reads its job keys with MGET and EXISTS; a job key of another
// type (MGET says nil, EXISTS counts it) is found and named, and nothing
// of the batch is written.
func TestEnqueueManyFindsWrongTypeJobKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	bad, _ := f.q.ks.jobKeyOf("b")
	require.NoError(t, f.rdb.RPush(f.ctx, bad, "x").Err())
	jobs, err := f.q.EnqueueMany(f.ctx, []JobSpec{
		{Type: "t", Opts: &EnqueueOpts{ID: "a"}}, {Type: "t", Opts: &EnqueueOpts{ID: "b"}}, {Type: "t", Opts: &EnqueueOpts{ID: "c"}},
	})
	// The unreadable key is b's own error; a and c are written.
	errs := jobErrs(t, err, 3)
	var wt *WrongTypeError
	require.ErrorAs(t, errs[1], &wt)
	require.Equal(t, bad, wt.Key)
	for _, i := range []int{0, 2} {
		require.NoError(t, errs[i])
		f.requireIndexed(t, jobs[i])
	}
	require.EqualValues(t, 1, f.rdb.LLen(f.ctx, bad).Val(), "the foreign key is untouched")
}

// In a group-commit batch, an Enqueue that repeats the ID of an earlier call
// in the same batch shares the fate of its first occurrence, but not its
// caller's giving up: when the first caller gave up (left out, errLeftOut),
// the repeat, whose caller is still waiting, is written, since nothing
// stands in its way, and never told "left out: the caller gave up".
func TestGroupEnqueueRepeatOfCallerWhoGaveUp(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	leaderIn, releaseLeader := make(chan struct{}), make(chan struct{})
	var watches atomic.Int32
	var cancelA atomic.Value
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if !reads(cmds) {
			return nil
		}
		switch watches.Add(1) {
		case 1: // the leader's flush: hold it until A and B queue up
			close(leaderIn)
			<-releaseLeader
		case 2: // the batch [A, B]: A's caller gives up just before the decision
			cancelA.Load().(context.CancelFunc)()
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	q.enqueues.Lanes = 1 // callers queue once every lane is busy: here, at once
	ctx := context.Background()

	type res struct {
		j   *Job
		err error
	}
	leader := make(chan res, 1)
	go func() { j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "leader"}); leader <- res{j, err} }()
	<-leaderIn
	actx, cancel := context.WithCancel(ctx)
	cancelA.Store(context.CancelFunc(cancel))
	a, b := make(chan res, 1), make(chan res, 1)
	go func() { j, err := q.Enqueue(actx, "t", nil, &EnqueueOpts{ID: "dup"}); a <- res{j, err} }()
	require.Eventually(t, func() bool { _, n := groupState(q.enqueues); return n == 1 },
		5*time.Second, time.Millisecond)
	go func() { j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "dup"}); b <- res{j, err} }()
	require.Eventually(t, func() bool { _, n := groupState(q.enqueues); return n == 2 },
		5*time.Second, time.Millisecond)
	close(releaseLeader)
	require.NoError(t, (<-leader).err)
	ra, rb := <-a, <-b
	require.ErrorIs(t, ra.err, context.Canceled, "A gave up")
	_, gerr := q.Get(ctx, "dup")
	t.Logf("B, still waiting, got (%v, %v); stored: %v", rb.j, rb.err, gerr)
	require.False(t, errors.Is(rb.err, errLeftOut), "B's caller never gave up, yet was told: %v", rb.err)
	require.NoError(t, rb.err, "nothing stood in the way of B's enqueue")
}

// MaxAttempts past what a stored value can hold is refused wherever it
// comes in, before anything is written; it used to be written and then
// read back as corrupt, so the job never ran.
func TestMaxAttemptsIsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	huge := MaxAttemptsLimit + 1
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "huge", MaxAttempts: huge})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.q.Get(f.ctx, "huge")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{MaxAttempts: huge}}})
	require.ErrorIs(t, err, ErrInvalid)

	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: MaxAttemptsLimit})
	require.NoError(t, err, "the limit itself is fine")
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = huge; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err, "the value still reads")
	require.Equal(t, MaxAttemptsLimit, got.MaxAttempts)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
}

// An enqueue's errors say "jobkey: " once, however many jobkey errors they
// wrap.
func TestEnqueueErrorsSayJobkeyOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t"}, {Type: ""}})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "jobkey: batch job 1: invalid argument")
	require.Equal(t, 1, strings.Count(err.Error(), "jobkey: "), err.Error())

	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys("bad").Job, "garbage", 0).Err())
	for _, many := range []bool{false, true} {
		if many {
			_, err = f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "bad"}}})
		} else {
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "bad"})
		}
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, `enqueue "bad": corrupt job value`)
		require.Equal(t, 1, strings.Count(err.Error(), "jobkey: "), err.Error())
	}
}
