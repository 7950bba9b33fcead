package jobkey

import (
	"fmt"
	"math"
	"time"

	"github.com/jobkey/jobkey/internal/msgpk"
)

// Outcome is how one run of a job ended, as its AttemptRecord keeps it.
// Its wire values are stored in Redis and must never be renumbered.
type Outcome uint8

// The ways a run ends.
const (
	OutcomeSucceeded Outcome = 1 // Complete
	OutcomeFailed    Outcome = 2 // Fail: the attempt is spent
	OutcomeSnoozed   Outcome = 3 // Snooze: the attempt is given back, RunAt set later
	OutcomeReleased  Outcome = 4 // Release: the attempt is given back (shutdown, say)
	OutcomeLost      Outcome = 5 // its lease ran out unrecorded; a claim found it so
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case OutcomeSucceeded:
		return "succeeded"
	case OutcomeFailed:
		return "failed"
	case OutcomeSnoozed:
		return "snoozed"
	case OutcomeReleased:
		return "released"
	case OutcomeLost:
		return "lease lost"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Valid reports whether o is one of the defined outcomes.
func (o Outcome) Valid() bool { return o >= OutcomeSucceeded && o <= OutcomeLost }

// AttemptRecord is one run of a job, kept in Job.History.
type AttemptRecord struct {
	Attempt  int           // the job's Attempt during the run
	Started  time.Time     // when the run's claim took the job, by Redis's clock
	Duration time.Duration // from Started until its outcome was written (or its lease ran out)
	Worker   string        // the LeaseOwner that ran it
	Outcome  Outcome       // how it ended
	Error    string        // its error, cut to MaxHistoryErrorLen; "" for a success
}

// Bounds of Job.History: the records kept, and the bytes of their Worker
// and Error text together. Older records are dropped first.
const (
	MaxHistoryEntries  = 20
	MaxHistoryBytes    = 8 << 10
	MaxHistoryErrorLen = 1 << 10 // of one record's Error
)

// historyRecordFields is the array length of one encoded record.
const historyRecordFields = 6

// recordRun appends to next's History the run of cur (the job as stored
// while active) that ends now with outcome and errText, then drops the
// oldest records past the bounds, counting them.
func recordRun(next, cur *Job, now time.Time, outcome Outcome, errText string) {
	rec := AttemptRecord{
		Attempt: cur.Attempt, Started: cur.StartedAt, Worker: cur.LeaseOwner,
		Outcome: outcome, Error: truncate(errText, MaxHistoryErrorLen),
	}
	if !cur.StartedAt.IsZero() && now.After(cur.StartedAt) {
		rec.Duration = now.Sub(cur.StartedAt).Truncate(time.Millisecond)
	}
	// A new slice: next is a shallow copy of cur, whose array a reader may hold.
	h := make([]AttemptRecord, 0, len(cur.History)+1)
	next.History = append(append(h, cur.History...), rec)
	trimHistory(next, MaxHistoryEntries, MaxHistoryBytes)
}

// historyFits drops the oldest records of next, counting them, while its
// value is past Config.MaxValueBytes: a run's record never refuses the
// write that records it (a claim that takes over a lost run, say).
func (d *decider) historyFits(next *Job) {
	for len(next.History) > 0 && encodedSize(next) > d.cfg.MaxValueBytes {
		trimHistory(next, len(next.History)-1, MaxHistoryBytes)
	}
}

// trimHistory drops the oldest records of j until at most entries remain
// and their text fits in size bytes, and counts the drop.
func trimHistory(j *Job, entries, size int) {
	n := historyTextBytes(j.History)
	drop := 0
	for drop < len(j.History) && (len(j.History)-drop > entries || n > size) {
		n -= len(j.History[drop].Worker) + len(j.History[drop].Error)
		drop++
	}
	if drop == 0 {
		return
	}
	j.History = j.History[drop:]
	if len(j.History) == 0 {
		j.History = nil
	}
	j.HistoryDropped = int(min(int64(j.HistoryDropped)+int64(drop), MaxAttemptsLimit))
}

// sameRecord compares two records, times by their instant.
func sameRecord(a, b AttemptRecord) bool {
	return a.Attempt == b.Attempt && a.Started.Equal(b.Started) && a.Duration == b.Duration &&
		a.Worker == b.Worker && a.Outcome == b.Outcome && a.Error == b.Error
}

func historyTextBytes(h []AttemptRecord) int {
	n := 0
	for _, r := range h {
		n += len(r.Worker) + len(r.Error)
	}
	return n
}

// validHistory refuses a History the value format does not hold.
func validHistory(h []AttemptRecord) error {
	if len(h) > MaxHistoryEntries {
		return fmt.Errorf("%w: History has %d records, limit %d", ErrInvalid, len(h), MaxHistoryEntries)
	}
	if n := historyTextBytes(h); n > MaxHistoryBytes {
		return fmt.Errorf("%w: History holds %d bytes of text, limit %d", ErrInvalid, n, MaxHistoryBytes)
	}
	for i, r := range h {
		switch {
		case r.Attempt < 0 || r.Attempt > MaxAttemptsLimit:
			return fmt.Errorf("%w: History[%d].Attempt is %d, want 0..%d", ErrInvalid, i, r.Attempt, MaxAttemptsLimit)
		case !r.Outcome.Valid():
			return fmt.Errorf("%w: History[%d].Outcome is %d", ErrInvalid, i, uint8(r.Outcome))
		case r.Duration < 0 || r.Duration%time.Millisecond != 0:
			return fmt.Errorf("%w: History[%d].Duration is %v, want whole milliseconds >= 0", ErrInvalid, i, r.Duration)
		case len(r.Error) > MaxHistoryErrorLen:
			return fmt.Errorf("%w: History[%d].Error is %d bytes, limit %d", ErrInvalid, i, len(r.Error), MaxHistoryErrorLen)
		}
	}
	return nil
}

// historySize is the length appendHistory produces.
func historySize(h []AttemptRecord) int {
	n := msgpk.ArrayHdrSize(len(h))
	for _, r := range h {
		n += msgpk.ArrayHdrSize(historyRecordFields) + msgpk.UintSize(uint64(r.Attempt)) +
			msgpk.IntSize(toMillis(r.Started)) + msgpk.IntSize(r.Duration.Milliseconds()) +
			msgpk.StrSize(r.Worker) + msgpk.UintSize(uint64(r.Outcome)) + msgpk.StrSize(r.Error)
	}
	return n
}

// appendHistory writes h as an array of records, each an array of
// Attempt, Started (unix ms), Duration (ms), Worker, Outcome, Error.
func appendHistory(b []byte, h []AttemptRecord) []byte {
	b = msgpk.AppendArrayHdr(b, len(h))
	for _, r := range h {
		b = msgpk.AppendArrayHdr(b, historyRecordFields)
		b = msgpk.AppendUint(b, uint64(r.Attempt))
		b = msgpk.AppendInt(b, toMillis(r.Started))
		b = msgpk.AppendInt(b, r.Duration.Milliseconds())
		b = msgpk.AppendStr(b, r.Worker)
		b = msgpk.AppendUint(b, uint64(r.Outcome))
		b = msgpk.AppendStr(b, r.Error)
	}
	return b
}

// decodeHistory reads Job.History, bounded as validHistory bounds it; the
// record count is checked before the slice is allocated.
func decodeHistory(d *msgpk.Decoder) ([]AttemptRecord, error) {
	const field = "History"
	at := d.Off
	n, err := d.ArrayLen(field)
	if err != nil {
		return nil, err
	}
	if n > MaxHistoryEntries {
		return nil, d.ErrorAt(at, field, fmt.Sprintf("%d records, limit %d", n, MaxHistoryEntries))
	}
	if n == 0 {
		return nil, nil
	}
	h := make([]AttemptRecord, n)
	text := 0
	for i := range h {
		rat := d.Off
		f, err := d.ArrayLen(field + " record")
		if err != nil {
			return nil, err
		}
		if f != historyRecordFields {
			return nil, d.ErrorAt(rat, field, fmt.Sprintf("record of %d elements, want %d", f, historyRecordFields))
		}
		r := &h[i]
		a, err := d.Uint(field+" Attempt", MaxAttemptsLimit)
		if err != nil {
			return nil, err
		}
		r.Attempt = int(a)
		started, err := d.Int(field+" Started", math.MinInt64, math.MaxInt64)
		if err != nil {
			return nil, err
		}
		r.Started = fromMillis(started)
		dur, err := d.Int(field+" Duration", 0, math.MaxInt64/int64(time.Millisecond))
		if err != nil {
			return nil, err
		}
		r.Duration = time.Duration(dur) * time.Millisecond
		if r.Worker, err = d.Str(field + " Worker"); err != nil {
			return nil, err
		}
		oat := d.Off
		o, err := d.Uint(field+" Outcome", math.MaxUint8)
		if err != nil {
			return nil, err
		}
		if r.Outcome = Outcome(o); !r.Outcome.Valid() {
			return nil, d.ErrorAt(oat, field, fmt.Sprintf("unknown outcome %d", o))
		}
		eat := d.Off
		if r.Error, err = d.Str(field + " Error"); err != nil {
			return nil, err
		}
		if len(r.Error) > MaxHistoryErrorLen {
			return nil, d.ErrorAt(eat, field, fmt.Sprintf("error of %d bytes, limit %d", len(r.Error), MaxHistoryErrorLen))
		}
		if text += len(r.Worker) + len(r.Error); text > MaxHistoryBytes {
			return nil, d.ErrorAt(rat, field, fmt.Sprintf("text exceeds %d bytes", MaxHistoryBytes))
		}
	}
	return h, nil
}
