package jobkey

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// renewer is a Work's one lease keeper. It renews the lease of every run
// every Lease/3 and fires each run's self-fence at its deadline, from one
// goroutine and one timer, in place of a goroutine, a timer and a fence
// timer per run: a run that ends before its first renewal, as most do,
// costs a heap push and a removal. A renewal itself runs on a goroutine of
// its own, so one slow Extend holds up no other run's renewal or fence.
type renewer struct {
	w    *worker
	mu   sync.Mutex
	due  runHeap       // runs by their next event: a renewal or the fence
	poke chan struct{} // a run went to the top of due
	quit chan struct{} // closed by close
	done chan struct{} // closed when loop has returned
}

func newRenewer(w *worker) *renewer {
	s := &renewer{w: w, poke: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// close stops the loop; runs still registered are no longer renewed nor
// fenced (Work cancels their contexts as it returns).
func (s *renewer) close() {
	close(s.quit)
	<-s.done
}

// add starts keeping r's lease: its first renewal is due after
// nextRenewal, its fence at its deadline.
func (s *renewer) add(r *run) {
	s.mu.Lock()
	r.renewAt = time.Now().Add(r.nextRenewal())
	s.push(r)
	s.mu.Unlock()
}

// remove stops keeping r's lease, and waits for a renewal of it in flight:
// nothing renews a run once it has stopped.
func (s *renewer) remove(r *run) {
	s.mu.Lock()
	r.stopped = true
	if r.idx >= 0 {
		heap.Remove(&s.due, r.idx)
	}
	s.mu.Unlock()
	r.renewals.Wait()
}

// push puts r in due at its next event, and wakes the loop when that is
// now the earliest. s.mu is held.
func (s *renewer) push(r *run) {
	if r.stopped {
		return
	}
	r.at = r.fenceAt()
	if !r.renewing && r.renewAt.Before(r.at) {
		r.at = r.renewAt
	}
	heap.Push(&s.due, r)
	if r.idx == 0 {
		select {
		case s.poke <- struct{}{}:
		default:
		}
	}
}

func (s *renewer) loop() {
	defer close(s.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var ready []*run
	for {
		s.mu.Lock()
		now := time.Now()
		ready = ready[:0]
		for len(s.due) > 0 && !s.due[0].at.After(now) {
			ready = append(ready, heap.Pop(&s.due).(*run))
		}
		for _, r := range ready {
			s.fire(r, now)
		}
		wait := time.Hour
		if len(s.due) > 0 {
			wait = s.due[0].at.Sub(now)
		}
		s.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-s.poke:
		case <-s.quit:
			return
		}
	}
}

// fire handles r's event at now: its fence, or its renewal. s.mu is held.
func (s *renewer) fire(r *run, now time.Time) {
	if !now.Before(r.fenceAt()) {
		r.expire() // and it is not kept any longer
		return
	}
	if r.abandoned.Load() {
		// Shutdown gave up on this run's stuck handler: fence, never renew.
		r.renewAt = r.fenceAt()
		s.push(r)
		return
	}
	if r.renewing || now.Before(r.renewAt) {
		s.push(r) // woken early: its deadline moved
		return
	}
	r.renewAt = now.Add(r.nextRenewal())
	if r.writing.Load() && r.left() > r.w.q.cfg.Lease/2 {
		// A renewal now would only abort the outcome write in flight
		// (both change the job's key); renew only if the lease needs it.
		s.push(r)
		return
	}
	r.renewing = true
	r.renewals.Add(1)
	s.push(r) // at its fence, while the renewal is in flight
	go s.renew(r)
}

// renew extends r's lease once, and cancels the handler when the lease is
// lost (reclaimed, canceled, finished, deleted).
func (s *renewer) renew(r *run) {
	defer r.renewals.Done()
	q := r.w.q
	asked := time.Now()
	// A renewal that lands after the deadline is useless: bound it.
	ctx, cancel := context.WithTimeout(r.w.writes, max(r.left(), time.Millisecond))
	j, err := q.Extend(ctx, r.current())
	cancel()
	keep := true
	var ll *LeaseLostError
	switch {
	case err == nil:
		r.confirm(asked, j)
	case errors.As(err, &ll) && ownCompletion(r.job, ll.Now):
		// The handler completed its own job (CompleteTx): its run is
		// over, and its outcome is recorded once it returns.
		r.own.CompareAndSwap(nil, ll.Now)
		keep = false
	case errors.As(err, &ll):
		if ll.Now.State == StateCanceled && ll.Now.LeaseToken == r.job.LeaseToken {
			r.end(ErrJobCanceled)
		} else {
			r.end(err)
		}
		keep = false
	case errors.Is(err, ErrNotFound):
		r.end(errors.Join(ErrLeaseLost, err)) // the job was deleted under us
		keep = false
	default:
		// Redis unreachable or slow: keep trying; the fence stops the
		// handler if the lease runs out meanwhile.
		r.w.o.Logger.Warn("jobkey: lease renewal failed", "queue", q.name, "job", r.job.ID, "err", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r.renewing = false
	if r.idx >= 0 {
		heap.Remove(&s.due, r.idx)
	}
	select {
	case <-r.expired:
		keep = false
	default:
	}
	if keep {
		s.push(r)
	}
}

// runHeap orders runs by their next event.
type runHeap []*run

func (h runHeap) Len() int           { return len(h) }
func (h runHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h runHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *runHeap) Push(x any) {
	r := x.(*run)
	r.idx = len(*h)
	*h = append(*h, r)
}
func (h *runHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	r.idx = -1
	return r
}
