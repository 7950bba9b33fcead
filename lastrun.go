package jobkey

import "time"

// A job's last run is bounded by its lease, whose end is the value's
// LeaseUntil in every state: a claim sets it, Extend moves it, and
// Complete, Fail and Release end it (they set it to the moment the run's
// outcome was recorded, after its handler returned). Cancel, Retry and
// Update leave it as it is, so after Cancel, Retry and Cancel again it
// still bounds the handler of the run that was canceled, which may still be
// stopping. A key with limit 1 holds the same lease in its value, but no
// key, or a larger limit, does not: this rule alone keeps such a job from
// running twice at once.
//
// While that lease may be in force, no write makes the job claimable
// before it ends (Retry, RetryFailed and Update move RunAt to its end) and
// none frees the job's ID (Delete, DeleteIn and DeleteFinished refuse, and
// a finished job's key outlives the lease, whatever its retention): a job
// enqueued again under the ID could otherwise run at once, beside it.

// lastRunMayGoOn says whether cur's last run may still be going on at now,
// by Redis's clock: its lease has not ended.
func lastRunMayGoOn(cur *Job, now time.Time) bool { return cur.LeaseUntil.After(now) }

// dueAfterLastRun returns t, or the end of cur's last run's lease when that
// is later: the earliest a write may make cur due.
func dueAfterLastRun(cur *Job, t time.Time) time.Time { return maxTime(t, cur.LeaseUntil) }

// lastRunLeft is how long cur's last run's lease lasts from now; 0 once it
// ended.
func lastRunLeft(cur *Job, now time.Time) time.Duration { return max(0, cur.LeaseUntil.Sub(now)) }

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
