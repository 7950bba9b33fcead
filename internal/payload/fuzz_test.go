package payload

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzMsgpackJSON holds, for any bytes: nothing panics; a msgpack
// rendering is valid JSON, the same every time, within its limit but for
// what closing it takes, and holds only printable runes; and what Show
// and Value give is inert in a terminal. The seeds are payloads as
// EnqueueArgs stores them, the job values of the codec's golden files,
// and hand-made edge cases.
func FuzzMsgpackJSON(f *testing.F) {
	for _, args := range []any{
		sendEmail{To: "ada@example.com", Subject: "Hello", Retries: 3, At: time.Date(2025, 3, 1, 12, 0, 0, 7, time.UTC),
			Tags: []string{"a", "b"}, Extra: map[string]any{"n": 1.5, "big": uint64(math.MaxUint64), "neg": -40,
				"nan": math.NaN(), "inf": math.Inf(-1), "list": []any{nil, true, "x"}}, Attach: []byte{0, 1, 2}},
		sendEmail{},
		map[int]string{1: "one"},
		[]any{[]any{[]any{map[string]any{"<script>": "\x1b[2J\u009b\u202e"}}}},
		"\xff\xfe not UTF-8",
		time.Time{},
	} {
		f.Add(enqueueArgsPayload(f, args))
	}
	golden, err := filepath.Glob("../../testdata/job-*.msgpack")
	require.NoError(f, err)
	require.NotEmpty(f, golden)
	for _, g := range golden {
		b, err := os.ReadFile(g)
		require.NoError(f, err)
		f.Add(b)
	}
	for _, s := range []string{"", "7", "a", "\xc1", "\x93\x01\x02", "\xdd\xff\xff\xff\xff", "\xd7\xff\xff\xff\xff\xff\x00\x00\x00\x00",
		"\x81\x92\x01\xa1x\x02", strings.Repeat("\x91", 64) + "\xc0", `{"a":[1,"\u009b"]}`} {
		f.Add([]byte(s))
	}
	const limit = 256
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, indent := range []string{"", "  "} {
			out, cut, err := MsgpackJSON(b, indent, limit)
			if err != nil {
				require.ErrorIs(t, err, ErrNotMsgpack)
				require.NotEqual(t, Msgpack, Classify(b))
				continue
			}
			require.True(t, json.Valid(out), "%q renders as invalid JSON %q", b, out)
			again, cutAgain, _ := MsgpackJSON(b, indent, limit)
			require.Equal(t, out, again)
			require.Equal(t, cut, cutAgain)
			// Past the limit come only the closing of the open containers,
			// each on its own indented line, and the element under way.
			closing := (MaxDepth + 1) * (2 + len(indent)*(MaxDepth+1))
			require.LessOrEqual(t, len(out), limit+closing+maxKey, "%q", b)
			require.True(t, inert(string(out), false), "%q renders %q", b, out)
		}
		v := Show(b, limit)
		require.True(t, inert(v.Text, true), "%q shows %q", b, v.Text)
		if f, val, _ := Value(b, limit); f != "" {
			require.True(t, json.Valid(val), "%q has value %q", b, val)
			require.True(t, inert(string(val), false), "%q has value %q", b, val)
		}
	})
}

// inert reports whether s is valid UTF-8 of printable runes, newlines
// and (with text) tabs and carriage returns.
func inert(s string, text bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) && r != '\n' && !(text && (r == '\t' || r == '\r')) {
			return false
		}
	}
	return true
}
