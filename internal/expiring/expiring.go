// Package expiring is a bounded set whose members leave by themselves
// after a time: the jobs of a newer format that claimers look past for a
// while, and the shards whose node could not be reached.
package expiring

import (
	"sync"
	"time"
)

// Set is a small set whose members leave TTL after they were added. At
// most Max members stay: when full, the expired ones go, and if none has,
// the one that would leave first. Its zero value with TTL and Max set is
// ready; it is safe for concurrent use.
type Set[K comparable] struct {
	TTL time.Duration // how long a member stays
	Max int           // the most members it holds

	mu     sync.Mutex
	until  map[K]time.Time
	purged time.Time
}

// Add puts k in the set, or renews it, for TTL.
func (s *Set[K]) Add(k K) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[K]time.Time{}
	}
	if _, ok := s.until[k]; !ok && len(s.until) >= s.Max {
		// Full: the expired members go, and if none has, the one that
		// would leave first.
		s.purge()
		if len(s.until) >= s.Max {
			var first K
			var at time.Time
			for m, t := range s.until {
				if at.IsZero() || t.Before(at) {
					first, at = m, t
				}
			}
			delete(s.until, first)
		}
	}
	s.until[k] = time.Now().Add(s.TTL)
}

// purge removes the expired members. s.mu is held.
func (s *Set[K]) purge() {
	now := time.Now()
	for m, t := range s.until {
		if now.After(t) {
			delete(s.until, m)
		}
	}
	s.purged = now
}

// Remove takes k out of the set.
func (s *Set[K]) Remove(k K) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.until, k)
}

// Has reports whether k is in the set and has not expired.
func (s *Set[K]) Has(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.until[k]
	if ok && time.Now().After(until) {
		delete(s.until, k)
		return false
	}
	return ok
}

// Size counts the members, purging the expired ones at most once a second.
func (s *Set[K]) Size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.until) > 0 && time.Since(s.purged) > time.Second {
		s.purge()
	}
	return len(s.until)
}
