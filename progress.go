package jobkey

import (
	"context"
	"fmt"
	"slices"
)

// MaxProgressBytes bounds Job.Progress.
const MaxProgressBytes = 1 << 10

// runKey is the context key under which Work hands a handler its run.
type runKey struct{}

// SetProgress reports the progress of the job whose handler ctx was given
// by Work: v becomes Job.Progress, a small value of the caller's own
// encoding (JSON, say) that Get, List, the UI and `jobkey show` display.
// It costs no round trip of its own: it rides the run's next lease
// renewal (every Config.Lease/3) and its outcome, whichever comes first,
// and a later call replaces an earlier one not yet written. It returns an
// error matching ErrInvalid for a v past MaxProgressBytes, or a ctx that
// is not a Work handler's.
func SetProgress(ctx context.Context, v []byte) error {
	r, _ := ctx.Value(runKey{}).(*run)
	switch {
	case r == nil:
		return fmt.Errorf("%w: SetProgress with a context that is not a Work handler's", ErrInvalid)
	case len(v) > MaxProgressBytes:
		return fmt.Errorf("%w: progress of job %q is %d bytes, limit %d", ErrInvalid, r.job.ID, len(v), MaxProgressBytes)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress, r.progressSet = slices.Clone(v), true
	return nil
}

// current is the run's job as its next write sends it: the claimed copy,
// with the progress its handler reported last.
func (r *run) current() *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.progressSet {
		return r.job
	}
	c := cloneJob(r.job)
	c.Progress = r.progress
	return c
}

// validProgress refuses a caller's copy whose Progress a value cannot hold.
func validProgress(j *Job) error {
	if len(j.Progress) > MaxProgressBytes {
		return fmt.Errorf("%w: Progress of job %q is %d bytes, limit %d", ErrInvalid, j.ID, len(j.Progress), MaxProgressBytes)
	}
	return nil
}
