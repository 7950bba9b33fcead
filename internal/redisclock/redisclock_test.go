package redisclock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// manual is a local clock a test moves by hand.
type manual struct{ t time.Time }

func (m *manual) now() time.Time { return m.t }

func TestEstimateBeforeAnyReplyIsTheLocalClockAndUnknown(t *testing.T) {
	t.Parallel()
	local := &manual{t: time.Date(2030, 1, 2, 3, 4, 5, 600_700_000, time.UTC)}
	c := &Clock{Local: local.now}
	got, known := c.Estimate()
	require.False(t, known)
	require.Equal(t, local.t.Truncate(time.Millisecond), got)
	require.Equal(t, got, c.Guess())
}

// A reply read over a 40 ms round trip is taken as Redis's time at the
// middle of it, and the estimate then moves with the local clock, never
// with the local clock's reading itself.
func TestEstimateAddsLocalTimeElapsedSinceTheReply(t *testing.T) {
	t.Parallel()
	local := &manual{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} // an hour behind Redis
	server := local.t.Add(time.Hour)
	c := &Clock{Local: local.now}
	sent, recv := local.t, local.t.Add(40*time.Millisecond)
	require.Equal(t, server, c.Observe(server, sent, recv), "a decision uses the reply itself")

	local.t = recv.Add(time.Second)
	got, known := c.Estimate()
	require.True(t, known)
	require.Equal(t, server.Add(time.Second+20*time.Millisecond), got)
}

func TestEstimateIsUTCToTheMillisecond(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("X", 5*3600)
	local := &manual{t: time.Date(2030, 1, 1, 0, 0, 0, 0, zone)}
	c := &Clock{Local: local.now}
	got := c.Observe(time.Date(2030, 1, 1, 0, 0, 0, 123_456_789, zone), local.t, local.t)
	require.Equal(t, time.UTC, got.Location())
	require.Equal(t, 123_000_000, got.Nanosecond())
}

func TestFakeReplacesRedisClock(t *testing.T) {
	t.Parallel()
	local := &manual{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	fake := time.Date(2040, 6, 1, 0, 0, 0, 0, time.UTC)
	c := &Clock{Local: local.now, Fake: func() time.Time { return fake }}
	got, known := c.Estimate()
	require.True(t, known)
	require.Equal(t, fake, got)
	require.Equal(t, fake, c.Observe(local.t, local.t, local.t), "a TIME reply gives way to the fake")
}
