package payload

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// sendEmail is job arguments as a user writes them for EnqueueArgs.
type sendEmail struct {
	To      string
	Subject string
	Retries int
	At      time.Time
	Tags    []string
	Extra   map[string]any
	Attach  []byte
}

func (sendEmail) Kind() string { return "send_email" }

// enqueueArgsPayload is the payload EnqueueArgs stores for args: their
// msgpack encoding (args.go).
func enqueueArgsPayload(t testing.TB, args any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(args)
	require.NoError(t, err)
	return b
}

func TestClassify(t *testing.T) {
	t.Parallel()
	mp := enqueueArgsPayload(t, sendEmail{To: "ada@example.com", Subject: "Hello"})
	for _, tc := range []struct {
		in   string
		want Format
	}{
		{"", ""},
		{`{"to":"ada"}`, JSON},
		{" [1, 2]\n", JSON},
		{`"quoted"`, JSON},
		{"7", JSON}, // also the msgpack integer 55: JSON wins
		{string(mp), Msgpack},
		{"\x93\x01\x02\x03", Msgpack},                 // [1,2,3]
		{"\xa5hello", Msgpack},                        // a msgpack string is not UTF-8 text
		{"\xc0", Msgpack},                             // nil
		{"\x93\x01\x02", Binary},                      // an array missing an element
		{"\x93\x01\x02\x03\x04", Binary},              // a byte left over
		{"\xdd\xff\xff\xff\xff", Binary},              // an array claiming 4 billion elements
		{"\xc1", Binary},                              // the code msgpack never uses
		{strings.Repeat("\x91", 66) + "\xc0", Binary}, // nested past MaxDepth
		{strings.Repeat("\x91", 64) + "\xc0", Msgpack},
		{"a", Text},        // also the msgpack integer 97: a scalar that is text stays text
		{"\xcc\x80", Text}, // U+0300, also the msgpack uint8 128
		{"hello\nworld\t!", Text},
		{"héllo ✓", Text},
		{"{not json", Text},
		{"zero\u200bwidth", Text}, // not printable, but no control: shown escaped
		{"\x00\x01\xff", Binary},
		{"\xc3\x28", Binary},             // invalid UTF-8
		{"red \x1b[31m", Binary},         // a terminal escape
		{"{\"a\":\"\u009b2J\"}", Binary}, // valid JSON holding a C1 control (CSI)
	} {
		require.Equal(t, tc.want, Classify([]byte(tc.in)), "%q", tc.in)
	}
}

func TestMsgpackJSONRendersEveryType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   any
		want string
	}{
		{"nil", nil, `null`},
		{"bools", []bool{true, false}, `[true,false]`},
		{"ints", []any{0, -1, -32, -33, 127, 128, 65535, -129, int64(-1 << 63)}, `[0,-1,-32,-33,127,128,65535,-129,-9223372036854775808]`},
		{"huge uint", uint64(1<<64 - 1), `18446744073709551615`},
		{"floats", []any{1.5, float32(0.1), 1e21, math.Copysign(0, -1)}, `[1.5,0.1,1e+21,-0]`},
		{"string", "hé \"q\" \\ <b>", `"hé \"q\" \\ <b>"`},
		{"map keeps its order", map[string]int{"b": 2}, `{"b":2}`},
		{"empty", []any{[]int{}, map[string]int{}}, `[[],{}]`},
		{"bin", []byte("hi"), `{"$bin":"aGk="}`},
		{"time", time.Date(2025, 3, 1, 12, 0, 0, 5, time.FixedZone("x", 3600)), `"2025-03-01T11:00:00.000000005Z"`},
		{"zero time", time.Time{}, `"0001-01-01T00:00:00Z"`},
	} {
		out, cut, err := MsgpackJSON(enqueueArgsPayload(t, tc.in), "", 1<<20)
		require.NoError(t, err, tc.name)
		require.False(t, cut, tc.name)
		require.Equal(t, tc.want, string(out), tc.name)
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"NaN", "\xcb\x7f\xf8\x00\x00\x00\x00\x00\x01", `"NaN"`},
		{"+Inf float32", "\xca\x7f\x80\x00\x00", `"Infinity"`},
		{"-Inf", "\xcb\xff\xf0\x00\x00\x00\x00\x00\x00", `"-Infinity"`},
		{"int keys", "\x82\x01\xa1a\xc0\xa1b", `{"1":"a","null":"b"}`},
		{"array key", "\x81\x92\x01\xa1x\x02", `{"[1,\"x\"]":2}`},
		{"bin key", "\x81\xc4\x01\xff\x02", `{"{\"$bin\":\"/w==\"}":2}`},
		{"duplicate keys kept", "\x82\xa1a\x01\xa1a\x02", `{"a":1,"a":2}`},
		{"ext", "\xd5\x05\x01\x02", `{"$ext":5,"$data":"AQI="}`},
		{"timestamp of a bad size is an ext", "\xd4\xff\x00", `{"$ext":-1,"$data":"AA=="}`},
		{"timestamp past a second of nanoseconds is an ext", "\xd7\xff\xff\xff\xff\xff\x00\x00\x00\x00", `{"$ext":-1,"$data":"/////wAAAAA="}`},
		{"invalid UTF-8", "\xa3a\xffb", `"a` + "\ufffd" + `b"`},
		{"controls escaped", "\xa6\x1b[2J\u009b", `"\u001b[2J\u009b"`},
		{"bidi override escaped", "\xa3\u202e", `"\u202e"`},
		{"astral non-printable", "\xa4\U000e0001", `"\udb40\udc01"`},
		{"html stays text", "\xa8<script>", `"<script>"`},
	} {
		out, cut, err := MsgpackJSON([]byte(tc.in), "", 1<<20)
		require.NoError(t, err, tc.name)
		require.False(t, cut, tc.name)
		require.Equal(t, tc.want, string(out), tc.name)
		require.True(t, json.Valid(out), tc.name)
	}
	_, _, err := MsgpackJSON([]byte("\x92\x01"), "", 1<<20)
	require.ErrorIs(t, err, ErrNotMsgpack)
}

func TestMsgpackJSONIndents(t *testing.T) {
	t.Parallel()
	out, _, err := MsgpackJSON([]byte("\x82\xa1n\x91\x01\xa2to\xa3ada"), "  ", 1<<20) // {"n":[1],"to":"ada"}
	require.NoError(t, err)
	var want strings.Builder
	for _, s := range []string{"{", `  "n": [`, "    1", "  ],", `  "to": "ada"`, "}"} {
		want.WriteString(s + "\n")
	}
	require.Equal(t, strings.TrimSuffix(want.String(), "\n"), string(out))
}

// A rendering past its limit stops, closes what is open and says so: the
// output stays valid JSON, and not much longer than the limit.
func TestMsgpackJSONCutsAtItsLimitAndStaysValid(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10000)
	for _, v := range []any{
		long,
		[]string{long, long},
		map[string]any{"a": []any{map[string]any{"b": long}}},
		map[string]int{long: 1},
		[]byte(long),
		make([]int, 5000),
	} {
		in := enqueueArgsPayload(t, v)
		for _, indent := range []string{"", "  "} {
			out, cut, err := MsgpackJSON(in, indent, 100)
			require.NoError(t, err)
			require.True(t, cut)
			require.True(t, json.Valid(out), "%s", out)
			require.Less(t, len(out), 200, "%s", out)
		}
	}
}

func TestShow(t *testing.T) {
	t.Parallel()
	args := sendEmail{To: "ada@example.com", Subject: "<script>alert(1)</script>\x1b[2J", Retries: 3,
		At: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), Tags: []string{"a"}, Attach: []byte{0, 1}}
	v := Show(enqueueArgsPayload(t, args), 1<<20)
	require.Equal(t, Msgpack, v.Format)
	require.False(t, v.Cut)
	require.Contains(t, v.Text, "{\n  \"To\": \"ada@example.com\",\n")
	require.Contains(t, v.Text, `"Subject": "<script>alert(1)</script>\u001b[2J"`)
	require.Contains(t, v.Text, `"At": "2025-03-01T12:00:00Z"`)
	require.Contains(t, v.Text, `"Attach": {"$bin": "AAE="}`)
	require.NotContains(t, v.Text, "\x1b")

	require.Equal(t, View{Format: JSON, Text: "{\n  \"a\": [\n    1\n  ]\n}"}, Show([]byte(` {"a":[1]} `), 1<<20))
	require.Equal(t, View{Format: JSON, Text: `"zero\u200bwidth"`}, Show([]byte("\"zero\u200bwidth\""), 1<<20))
	require.Equal(t, View{Format: Text, Text: `zero\u200bwidth` + "\n"}, Show([]byte("zero\u200bwidth\n"), 1<<20))
	require.Equal(t, View{}, Show(nil, 1<<20))
	v = Show([]byte{0, 1, 2, 0xff}, 1<<20)
	require.Equal(t, Binary, v.Format)
	require.Contains(t, v.Text, "00 01 02 ff")

	big := []byte(strings.Repeat("é", 1000))
	v = Show(big, 101)
	require.True(t, v.Cut)
	require.Len(t, v.Text, 100, "cut at a rune, not inside one")
	v = Show(append([]byte{0}, big...), 100)
	require.True(t, v.Cut)
	require.Equal(t, 7, strings.Count(v.Text, "\n"), "the dump of the first 100 bytes")
}

func TestValue(t *testing.T) {
	t.Parallel()
	f, v, cut := Value([]byte("{ \"to\" : \"ada\" }"), 1<<20)
	require.Equal(t, JSON, f)
	require.Equal(t, `{"to":"ada"}`, string(v))
	require.False(t, cut)

	f, v, _ = Value(enqueueArgsPayload(t, map[string]string{"to": "ada"}), 1<<20)
	require.Equal(t, Msgpack, f)
	require.Equal(t, `{"to":"ada"}`, string(v))

	f, v, _ = Value([]byte("plain <b>\u202e"), 1<<20)
	require.Equal(t, Text, f)
	var s string
	require.NoError(t, json.Unmarshal(v, &s))
	require.Equal(t, "plain <b>\u202e", s, "the text exactly")
	require.NotContains(t, string(v), "\u202e", "escaped")

	bin := []byte{0, 0xfe, 7}
	f, v, _ = Value(bin, 1<<20)
	require.Equal(t, Binary, f)
	require.NoError(t, json.Unmarshal(v, &s))
	require.Equal(t, base64.StdEncoding.EncodeToString(bin), s)

	f, v, cut = Value(enqueueArgsPayload(t, make([]int, 1000)), 100)
	require.Equal(t, Msgpack, f)
	require.True(t, cut)
	require.True(t, json.Valid(v))

	f, v, _ = Value(nil, 1<<20)
	require.Empty(t, f)
	require.Nil(t, v)
}
