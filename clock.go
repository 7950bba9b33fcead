package jobkey

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverClock tells time by Redis's clock, never by this host's.
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
type serverClock struct {
	local func() time.Time // this host's clock (Config.Now)
	// fake, when set, replaces Redis's clock: tests move time with it.
	fake func() time.Time

	// The last sample: Redis's clock read at local time at. Estimates add
	// the local time elapsed since, which uses the monotonic clock when the
	// local clock has one, so a step of this host's wall clock does not
	// move them.
	mu     sync.Mutex
	server time.Time
	at     time.Time
	known  bool
}

// observe turns a TIME reply read between sent and recv (local clock) into
// the time to decide with, and keeps it as the sample for later estimates.
func (c *serverClock) observe(server, sent, recv time.Time) time.Time {
	if c.fake != nil {
		server = c.fake()
	}
	mid := sent.Add(recv.Sub(sent) / 2)
	c.mu.Lock()
	c.server, c.at, c.known = server, mid, true
	c.mu.Unlock()
	return server.UTC().Truncate(time.Millisecond)
}

// estimate returns Redis's time as estimated from the last TIME reply, and
// false when no reply has been seen yet.
func (c *serverClock) estimate() (time.Time, bool) {
	if c.fake != nil {
		return c.fake().UTC().Truncate(time.Millisecond), true
	}
	c.mu.Lock()
	server, at, ok := c.server, c.at, c.known
	c.mu.Unlock()
	if !ok {
		return c.local().UTC().Truncate(time.Millisecond), false
	}
	return server.Add(c.local().Sub(at)).UTC().Truncate(time.Millisecond), true
}

// now returns the estimate of Redis's time, asking Redis once when nothing
// is known yet (the first call of a new Queue that reads before it writes).
func (c *serverClock) now(ctx context.Context, rdb redis.UniversalClient) (time.Time, error) {
	if t, ok := c.estimate(); ok {
		return t, nil
	}
	sent := c.local()
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("jobkey: read Redis's clock: %w", err)
	}
	return c.observe(t, sent, c.local()), nil
}

// guess is the estimate, or this host's clock when nothing is known yet. It
// serves only where the exact value does not matter, such as sizing a value
// whose times the compare-and-set will set.
func (c *serverClock) guess() time.Time {
	t, _ := c.estimate()
	return t
}
