package jobkey

import (
	"cmp"
	"time"
)

// A job's own Retention (EnqueueOpts.Retention) takes the place of
// Config.Retention for that job: its key's expiry when it succeeds or is
// canceled (Queue.write), and when its listing entries go (Trim). A failed
// job keeps Config.FailedRetention. Either way the key lives at least
// until its last run's lease ends (lastrun.go).

// retention is how long a finished job's key lives: Config.FailedRetention
// for a failed job, else the job's own Retention or Config.Retention.
func (d *decider) retention(j *Job) time.Duration {
	if j.State == StateFailed {
		return d.cfg.FailedRetention
	}
	return cmp.Or(j.Retention, d.cfg.Retention)
}

// entryOf is derive(j) as this queue writes it. Trim removes the entries of
// finished jobs by score, a retention after it (trim.go); the entry of a
// job that has a Retention of its own is scored that much later or
// earlier than its finish, so that it goes when its key expires, not when
// a job of the queue's retention would. Stats counts it while its key
// lives, and List orders it by that score.
func (d *decider) entryOf(j *Job) entry {
	e := derive(j)
	if j.Retention > 0 && (j.State == StateSucceeded || j.State == StateCanceled) {
		e.score += (j.Retention - d.cfg.Retention).Milliseconds()
	}
	return e
}
