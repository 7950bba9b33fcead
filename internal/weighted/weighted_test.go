package weighted

import (
	"context"
	"testing"
	"time"
)

// acquired reports whether Acquire(i) returns within a moment.
func acquired(g *Gate, i int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	return g.Acquire(ctx, i)
}

func TestGateHandsOutAtMostItsRuns(t *testing.T) {
	g := New(2, []int{1, 1}, false)
	if !acquired(g, 0) || !acquired(g, 1) {
		t.Fatal("two free runs")
	}
	if acquired(g, 0) {
		t.Fatal("a third run out of two")
	}
	g.Release()
	if !acquired(g, 1) {
		t.Fatal("a released run is handed out again")
	}
}

// A waiter that gives up passes on a run handed to it.
func TestGateWaiterThatLeavesPassesItsRunOn(t *testing.T) {
	g := New(1, []int{1, 1}, false)
	if !acquired(g, 0) {
		t.Fatal("one free run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan bool)
	go func() { got <- g.Acquire(ctx, 1) }()
	for {
		g.mu.Lock()
		w := g.waiting[1]
		g.mu.Unlock()
		if w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	g.mu.Lock()
	g.give() // as Release would, but the waiter leaves before taking it
	g.mu.Unlock()
	cancel()
	if ok := <-got; ok {
		g.Release() // it took the run before it saw ctx end: give it back
	}
	if !acquired(g, 0) {
		t.Fatal("the run was lost with the waiter that left")
	}
}

// Strict: a freed run goes to the heaviest queue that waits; Keep gives
// a lighter queue's run up to a heavier one that waits, and keeps it
// against a queue that is idle.
func TestGateStrictAndKeep(t *testing.T) {
	g := New(1, []int{5, 1}, true)
	if !acquired(g, 1) {
		t.Fatal("one free run")
	}
	if !g.Keep(1) {
		t.Fatal("nobody else waits: keep it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan bool, 1)
	go func() { got <- g.Acquire(ctx, 0) }()
	for {
		g.mu.Lock()
		w := g.waiting[0]
		g.mu.Unlock()
		if w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	g.SetIdle(0, time.Now().Add(time.Hour))
	if !g.Keep(1) {
		t.Fatal("the heavier queue is idle: its poll does not take the run")
	}
	g.SetIdle(0, time.Time{})
	if g.Keep(1) {
		t.Fatal("strict: the heavier queue that waits takes the run")
	}
	g.Release()
	if !<-got {
		t.Fatal("the heavier queue's waiter got the run")
	}
}

// Weighted: freed runs go to the waiting queues in proportion to their
// weights.
func TestGateDrawsByWeight(t *testing.T) {
	g := New(1, []int{3, 1}, false)
	count := [2]int{}
	for range 4000 {
		g.waiting[0], g.waiting[1] = 1, 1
		q := g.pick(-1, true)
		count[q]++
	}
	if count[0] < 2700 || count[0] > 3300 {
		t.Fatalf("weights 3:1 drew %v", count)
	}
}
