package main

import (
	"strings"
	"testing"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// A job's type and a worker's name are the caller's bytes: events prints
// them escaped, so they can neither send escape sequences to the terminal
// nor forge a line (a "# cursor" a script would resume from).
func TestEventsCommandPrintsHostileNamesInert(t *testing.T) {
	f := newFixture(t, 1)
	require.NoError(t, f.q.EnableEvents(f.ctx))
	typ := "evil\x1b[2J\n# cursor e1:forged\r"
	j, err := f.q.Enqueue(f.ctx, typ, nil, &jobkey.EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w\x1b]0;pwned\x07\nworker")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)

	out, err := f.run("events")
	require.NoError(t, err)
	require.NotContains(t, out, "\x1b", "no escape sequence reaches the terminal")
	require.NotContains(t, out, "\r")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, "events on, the enqueue, the claim, the cursor: one line each\n%s", out)
	require.NotContains(t, lines, "# cursor e1:forged")
	require.True(t, strings.HasPrefix(lines[3], "# cursor e1:"), lines[3])
}
