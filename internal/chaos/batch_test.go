package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// batchCallbackType is the type of the batches' callbacks.
const batchCallbackType = "chaos-batch-done"

// batchLog follows the batches the chaos run makes: each acknowledged
// batch's ID, and every run of a callback by its attempt. A callback
// written twice would be a new job, run from attempt 1 again: one attempt
// run twice is a double (the operator's cancels and evictions never touch
// these jobs, and their handler never snoozes, which gives an attempt
// back). A callback that runs while its batch counts a job pending ran
// early.
type batchLog struct {
	mu    sync.Mutex
	ids   []string
	runs  map[string]map[int]int // batch ID -> attempt -> runs
	early int
}

// produce makes batches of 2 to 6 jobs until ctx ends. A call that
// errors may have landed: it is made again with the same ID until it is
// known (ErrBatchExists says it landed before).
func (l *batchLog) produce(ctx context.Context, q *jobkey.Queue) {
	for n := 0; ctx.Err() == nil; n++ {
		id := fmt.Sprintf("batch-%d", n)
		jobs := make([]jobkey.JobSpec, 2+rand.N(5))
		for i := range jobs {
			jobs[i] = jobkey.JobSpec{Type: "chaos-batch-job"}
		}
		cond := jobkey.BatchAllFinished
		if n%2 == 1 {
			cond = jobkey.BatchAllSucceeded
		}
		for ctx.Err() == nil {
			_, _, err := q.EnqueueBatch(context.Background(), jobs, jobkey.JobSpec{Type: batchCallbackType}, &jobkey.BatchOpts{ID: id, Condition: cond})
			if err == nil || errors.Is(err, jobkey.ErrBatchExists) {
				l.mu.Lock()
				l.ids = append(l.ids, id)
				l.mu.Unlock()
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(20+rand.N(60)) * time.Millisecond)
	}
}

// run is the handler of batch jobs and callbacks: a job fails for good
// one time in five and fails to be retried one time in ten.
func (l *batchLog) run(ctx context.Context, admin *jobkey.Queue, j *jobkey.Job) ([]byte, error) {
	if j.Type == batchCallbackType {
		b, err := admin.Batch(ctx, j.ID)
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.runs == nil {
			l.runs = map[string]map[int]int{}
		}
		if l.runs[j.ID] == nil {
			l.runs[j.ID] = map[int]int{}
		}
		l.runs[j.ID][j.Attempt]++
		if err == nil && b.Pending > 0 {
			l.early++
		}
		return nil, nil
	}
	select {
	case <-time.After(time.Duration(rand.N(3)) * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	switch rand.N(10) {
	case 0, 1:
		return nil, jobkey.ErrSkipRetry
	case 2:
		return nil, errors.New("flaky")
	}
	return nil, nil
}

// checkBatches counts, once the queue is drained, the batches whose
// callback was never written, or written twice.
func (r *result) checkBatches(t *testing.T, q *jobkey.Queue, l *batchLog) {
	t.Helper()
	ctx := context.Background()
	l.mu.Lock()
	defer l.mu.Unlock()
	r.batches, r.batchEarly = len(l.ids), l.early
	for _, id := range l.ids {
		b, err := q.Batch(ctx, id)
		require.NoError(t, err)
		cb, err := q.Get(ctx, id)
		switch {
		case b.Fired == jobkey.BatchNotFired || b.Pending != 0 || errors.Is(err, jobkey.ErrNotFound):
			r.batchMissed++
			continue
		case err != nil:
			require.NoError(t, err)
		}
		if b.Succeeded+b.Failed+b.Canceled != b.Total || !cb.CreatedAt.Equal(b.FiredAt) {
			r.batchDoubled++
			continue
		}
		for _, n := range l.runs[id] {
			if n > 1 {
				r.batchDoubled++
				break
			}
		}
		if b.Fired == jobkey.BatchFiredEnqueued && len(l.runs[id]) == 0 {
			r.batchMissed++ // written, and never run
		}
	}
}
