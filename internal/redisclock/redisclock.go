// Package redisclock tells time by a Redis server's clock, never by this
// host's: the TIME replies a caller observes, and an estimate between them.
package redisclock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Clock tells time by Redis's clock, never by this host's.
//
// Every decision about time (is a job due, has a lease run out, when does a
// new lease end) is made in a compare-and-set whose first round trip also
// reads TIME, so it uses the clock of the server that holds the job. Clients
// whose own clocks disagree by seconds or hours therefore agree on every
// decision. Reads that only look for candidates (the due entries of an
// index, the counts of Stats) use an estimate: the last TIME reply plus
// the time this host measured since, refreshed by every round trip that
// carries a TIME. A wrong estimate can only make a claimer look at a job
// too early or too late; the compare-and-set still decides by TIME.
//
// Set Local before use, and Fake, if at all, before sharing the Clock.
type Clock struct {
	Local func() time.Time // this host's clock (jobkey's Config.Now)
	// Fake, when set, replaces Redis's clock: tests move time with it.
	Fake func() time.Time

	// The last sample: Redis's clock read at local time at. Estimates add
	// the local time elapsed since, which uses the monotonic clock when the
	// local clock has one, so a step of this host's wall clock does not
	// move them.
	mu     sync.Mutex
	server time.Time
	at     time.Time
	known  bool
}

// Observe turns a TIME reply read between sent and recv (local clock) into
// the time to decide with, and keeps it as the sample for later estimates.
func (c *Clock) Observe(server, sent, recv time.Time) time.Time {
	if c.Fake != nil {
		server = c.Fake()
	}
	mid := sent.Add(recv.Sub(sent) / 2)
	c.mu.Lock()
	c.server, c.at, c.known = server, mid, true
	c.mu.Unlock()
	return server.UTC().Truncate(time.Millisecond)
}

// Estimate returns Redis's time as estimated from the last TIME reply, and
// false when no reply has been seen yet.
func (c *Clock) Estimate() (time.Time, bool) {
	if c.Fake != nil {
		return c.Fake().UTC().Truncate(time.Millisecond), true
	}
	c.mu.Lock()
	server, at, ok := c.server, c.at, c.known
	c.mu.Unlock()
	if !ok {
		return c.Local().UTC().Truncate(time.Millisecond), false
	}
	return server.Add(c.Local().Sub(at)).UTC().Truncate(time.Millisecond), true
}

// Now returns the estimate of Redis's time, asking Redis once when nothing
// is known yet (the first call of a new Queue that reads before it writes).
func (c *Clock) Now(ctx context.Context, rdb redis.UniversalClient) (time.Time, error) {
	if t, ok := c.Estimate(); ok {
		return t, nil
	}
	sent := c.Local()
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("jobkey: read Redis's clock: %w", err)
	}
	return c.Observe(t, sent, c.Local()), nil
}

// Guess is the estimate, or this host's clock when nothing is known yet. It
// serves only where the exact value does not matter, such as sizing a value
// whose times the compare-and-set will set.
func (c *Clock) Guess() time.Time {
	t, _ := c.Estimate()
	return t
}
