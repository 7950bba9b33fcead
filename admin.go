package jobkey

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// StateError reports an operation that the job's current state does not
// allow, such as canceling a job that already succeeded.
type StateError struct {
	ID    string
	Op    string // "cancel", "retry", ...
	State State  // the state the job is in
}

func (e *StateError) Error() string {
	return fmt.Sprintf("jobkey: cannot %s job %q: it is %s", e.Op, e.ID, e.State)
}

// Cancel cancels a pending or active job. The worker of an active job gets
// ErrLeaseLost on its next write, and Work cancels its handler's context.
// Canceling a canceled job returns it unchanged; a succeeded or failed job
// returns a *StateError.
func (q *Queue) Cancel(ctx context.Context, id string) (*Job, error) {
	return q.update(ctx, id, []string{idxReady, idxLeased, idxCanceled}, func(cur *Job, _ time.Time) (*Job, error) {
		switch cur.State {
		case StateCanceled:
			return nil, nil
		case StatePending, StateActive:
			cur.State = StateCanceled
			return cur, nil
		}
		return nil, &StateError{ID: id, Op: "cancel", State: cur.State}
	}, q.ks.cancelChannel())
}

// Retry puts a failed or canceled job back to pending, due now, with its
// attempts counted from zero again. Its retention expiry is removed.
func (q *Queue) Retry(ctx context.Context, id string) (*Job, error) {
	return q.update(ctx, id, []string{idxReady, idxFailed, idxCanceled}, func(cur *Job, now time.Time) (*Job, error) {
		if cur.State != StateFailed && cur.State != StateCanceled {
			return nil, &StateError{ID: id, Op: "retry", State: cur.State}
		}
		cur.State = StatePending
		cur.Attempt = 0
		cur.RunAt = now
		return cur, nil
	}, q.ks.wakeChannel())
}

// Update edits a job by compare-and-set: fn gets the job as stored now and
// edits it in place; the edit is written only if nobody changed the job in
// between (otherwise fn runs again on the newer job). fn may change Type,
// Payload, RunAt, MaxAttempts, LastError and Result; the fields that say
// where the job stands are changed by Claim, Complete, Fail, Release, Cancel
// and Retry only. An error from fn is returned and nothing is written.
func (q *Queue) Update(ctx context.Context, id string, fn func(*Job) error) (*Job, error) {
	if fn == nil {
		return nil, fmt.Errorf("%w: Update with nil func", ErrInvalid)
	}
	return q.update(ctx, id, nil, func(cur *Job, _ time.Time) (*Job, error) {
		before := *cur
		if err := fn(cur); err != nil {
			return nil, err
		}
		if err := q.editable(&before, cur); err != nil {
			return nil, err
		}
		return cur, nil
	}, "")
}

func (q *Queue) editable(before, after *Job) error {
	fixed := []struct {
		name string
		same bool
	}{
		{"ID", before.ID == after.ID}, {"Queue", before.Queue == after.Queue}, {"State", before.State == after.State},
		{"Attempt", before.Attempt == after.Attempt}, {"LeaseOwner", before.LeaseOwner == after.LeaseOwner},
		{"LeaseUntil", before.LeaseUntil.Equal(after.LeaseUntil)}, {"CreatedAt", before.CreatedAt.Equal(after.CreatedAt)},
		{"Rev", before.Rev == after.Rev}, {"LeaseToken", before.LeaseToken == after.LeaseToken},
	}
	for _, f := range fixed {
		if !f.same {
			return fmt.Errorf("%w: Update may not change %s of job %q", ErrInvalid, f.name, before.ID)
		}
	}
	if after.Type == "" || len(after.Type) > MaxTypeLen {
		return fmt.Errorf("%w: Update: job type must be 1..%d bytes", ErrInvalid, MaxTypeLen)
	}
	if after.MaxAttempts < max(1, after.Attempt) || after.MaxAttempts > MaxAttemptsLimit {
		// Below Attempt, the job would have used more attempts than it may.
		return fmt.Errorf("%w: Update: MaxAttempts is %d, want %d..%d (at least the %d attempts made)",
			ErrInvalid, after.MaxAttempts, max(1, after.Attempt), MaxAttemptsLimit, after.Attempt)
	}
	if !after.RunAt.IsZero() && !after.RunAt.Equal(before.RunAt) {
		if err := validTime("RunAt", after.RunAt); err != nil {
			return err
		}
	}
	if n := encodedSize(after); n > q.cfg.MaxValueBytes {
		return fmt.Errorf("%w: job %q would be %d bytes, limit %d", ErrTooLarge, after.ID, n, q.cfg.MaxValueBytes)
	}
	return nil
}

// Stats counts a queue's jobs from its indexes.
type Stats struct {
	Pending       int64 // waiting: Due + Scheduled
	Due           int64 // pending with RunAt reached
	Scheduled     int64 // pending with RunAt in the future
	Active        int64 // claimed, lease included those expired
	ExpiredLeases int64 // active with the lease run out, waiting to be reclaimed
	Succeeded     int64 // within Config.Retention
	Failed        int64 // within Config.FailedRetention
	Canceled      int64 // within Config.Retention
	// Corrupt counts jobs whose stored value could not be read (corrupt,
	// written by a newer jobkey, or not a string). Claimers set them aside;
	// their bytes are kept for inspection (see Verify).
	Corrupt int64
}

// Stats returns exact counts of pending, due, scheduled, active and expired
// jobs, read from the indexes in one round trip per node. Finished counts
// cover the jobs still retained. Due and expired are judged by the estimate
// of Redis's clock (see Config.Now); the round trip refreshes it.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	now, err := q.clock.now(ctx, q.rdb)
	if err != nil {
		return Stats{}, err
	}
	nowS := strconv.FormatInt(toMillis(now), 10)
	cut := func(s State) string { return strconv.FormatInt(toMillis(now.Add(-q.retention(s))), 10) }
	type counts struct{ ready, due, leased, expired, ok, failed, canceled, corrupt *redis.IntCmd }
	per := make([]counts, q.ks.shards)
	var all []*redis.IntCmd
	var keys []string
	add := func(key string, c *redis.IntCmd) *redis.IntCmd {
		all, keys = append(all, c), append(keys, key)
		return c
	}
	var clock *redis.TimeCmd
	sent := q.clock.local()
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for s := range q.ks.shards {
			ready, leased := q.ks.index(s, idxReady), q.ks.index(s, idxLeased)
			done := func(st State, idx string) *redis.IntCmd {
				key := q.ks.index(s, idx)
				return add(key, p.ZCount(ctx, key, cut(st), "+inf"))
			}
			per[s] = counts{
				ready:    add(ready, p.ZCard(ctx, ready)),
				due:      add(ready, p.ZCount(ctx, ready, "-inf", nowS)),
				leased:   add(leased, p.ZCard(ctx, leased)),
				expired:  add(leased, p.ZCount(ctx, leased, "-inf", nowS)),
				ok:       done(StateSucceeded, idxSucceeded),
				failed:   done(StateFailed, idxFailed),
				canceled: done(StateCanceled, idxCanceled),
				corrupt:  add(q.ks.index(s, idxCorrupt), p.ZCard(ctx, q.ks.index(s, idxCorrupt))),
			}
		}
		return nil
	})
	if err != nil {
		for i, c := range all {
			if isWrongType(c.Err()) {
				return Stats{}, &WrongTypeError{Key: keys[i], Want: "zset", Got: "non-zset"}
			}
		}
		return Stats{}, fmt.Errorf("jobkey: stats of %q: %w", q.name, err)
	}
	q.clock.observe(clock.Val(), sent, q.clock.local())
	var st Stats
	for _, c := range per {
		st.Pending += c.ready.Val()
		st.Due += c.due.Val()
		st.Active += c.leased.Val()
		st.ExpiredLeases += c.expired.Val()
		st.Succeeded += c.ok.Val()
		st.Failed += c.failed.Val()
		st.Canceled += c.canceled.Val()
		st.Corrupt += c.corrupt.Val()
	}
	st.Scheduled = st.Pending - st.Due
	return st, nil
}
