package svgchart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// element is one element of a parsed document: its name, its attributes,
// its own character data and the text of its <title> child.
type element struct {
	name  string
	attrs map[string]string
	text  string
	title string
}

// parse reads doc strictly as XML, failing the test on any error, and
// returns its elements in document order (a <title> is its parent's
// title, not an element of its own).
func parse(t *testing.T, doc []byte) []element {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	dec.Strict = true
	var out []element
	var open []int // indexes into out of the elements not yet ended; -1 for a title
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the document is well-formed XML")
		switch tok := tok.(type) {
		case xml.StartElement:
			if tok.Name.Local == "title" {
				open = append(open, -1)
				continue
			}
			e := element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			open = append(open, len(out)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) == 0 {
				continue
			}
			if i := open[len(open)-1]; i >= 0 {
				out[i].text += string(tok)
			} else {
				out[open[len(open)-2]].title += string(tok)
			}
		}
	}
	require.NotEmpty(t, out)
	require.Equal(t, "svg", out[0].name)
	require.Equal(t, "http://www.w3.org/2000/svg", out[0].attrs["xmlns"])
	return out
}

// withClass returns the elements of class c.
func withClass(elems []element, c string) []element {
	var out []element
	for _, e := range elems {
		if e.attrs["class"] == c {
			out = append(out, e)
		}
	}
	return out
}

// texts returns the character data of the <text> elements of class c.
func texts(elems []element, c string) []string {
	var out []string
	for _, e := range withClass(elems, c) {
		if e.name == "text" {
			out = append(out, e.text)
		}
	}
	return out
}

func attr(t *testing.T, e element, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attrs[name], 64)
	require.NoError(t, err, "%s=%q of %s", name, e.attrs[name], e.name)
	return v
}

// A label is character data and nothing else: markup, quotes, ampersands,
// control characters and invalid UTF-8 in any caller string neither add an
// element nor an attribute, and the document stays well-formed.
func TestHostileLabelsStayText(t *testing.T) {
	t.Parallel()
	hostile := `</text><script>alert(1)</script><text x="0" onload="alert(2)">&amp;&lt;' ]]>` + "\x00\x1b[31m\xff\xfe"
	lines := (&Lines{Title: "T" + hostile, XLabel: "X" + hostile, YLabel: "Y" + hostile,
		XTicks: []Tick{{Value: 1, Label: "t" + hostile}},
		Series: []Series{{Name: "S" + hostile, Points: []Point{{1, 2}, {3, 4}}}}}).SVG()
	bars := (&Bars{Title: "T" + hostile, XLabel: "X" + hostile, Unit: "U" + hostile,
		Groups: []Group{{Label: "G" + hostile, Bars: []Bar{{Name: "B" + hostile, Segments: []Segment{{Name: "N" + hostile, Value: 1}}}}}},
		Legend: []LegendItem{{Name: "L" + hostile}}}).SVG()
	// What a reader sees: the label with the bytes XML cannot carry
	// replaced by U+FFFD.
	seen := strings.NewReplacer("\x00", "\uFFFD", "\x1b", "\uFFFD", "\xff", "\uFFFD", "\xfe", "\uFFFD").Replace(hostile)
	allowed := map[string]bool{"svg": true, "rect": true, "text": true, "line": true, "polyline": true, "circle": true, "polygon": true}
	for _, doc := range [][]byte{lines, bars} {
		elems := parse(t, doc)
		var all []string
		for _, e := range elems {
			require.True(t, allowed[e.name], "no <%s> element", e.name)
			for k, v := range e.attrs {
				require.NotContains(t, k, "onload")
				require.NotContains(t, v, "alert", "attribute %s of <%s>", k, e.name)
			}
			all = append(all, e.text, e.title)
		}
		joined := strings.Join(all, "\n")
		require.Contains(t, joined, "T"+seen, "the title reads as given")
		require.Contains(t, joined, "X"+seen)
	}
	elems := parse(t, lines)
	require.Contains(t, texts(elems, "legend"), "S"+seen)
	require.Contains(t, texts(elems, "tick"), "t"+seen)
	require.Contains(t, texts(elems, "label"), "Y"+seen)
	elems = parse(t, bars)
	require.Contains(t, texts(elems, "group"), "G"+seen)
	require.Contains(t, texts(elems, "legend"), "L"+seen)
	require.Equal(t, "G"+seen+", B"+seen+": N"+seen+" 1 U"+seen, withClass(elems, "bar")[0].title)
}

func TestValueIsShortAndNeverAnExponentForReportMagnitudes(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{
		0: "0", 123456: "123456", 1234.5: "1235", 100: "100", 99.94: "99.9", 12.345: "12.3",
		1: "1", 0.5: "0.5", 0.01234: "0.0123", -3.5: "-3.5", 0.0001: "1.00e-04",
	} {
		require.Equal(t, want, Value(v), "%v", v)
	}
}

func TestValueAxisEndsOnARoundNumberWithRoundTicks(t *testing.T) {
	t.Parallel()
	labels := func(ticks []Tick) []string {
		var out []string
		for _, tk := range ticks {
			out = append(out, tk.Label)
		}
		return out
	}
	min, max, ticks := valueAxis(0, 43210)
	require.Equal(t, []float64{0, 50000}, []float64{min, max})
	require.Equal(t, []string{"0", "10k", "20k", "30k", "40k", "50k"}, labels(ticks))
	min, max, ticks = valueAxis(0, 0.37)
	require.Equal(t, []float64{0, 0.4}, []float64{min, max})
	require.Equal(t, []string{"0", "0.1", "0.2", "0.3", "0.4"}, labels(ticks))
	_, max, ticks = valueAxis(0, 0)
	require.Equal(t, 1.0, max, "all zero: an axis to 1")
	require.Equal(t, "1.0", ticks[len(ticks)-1].Label)
	min, _, ticks = valueAxis(-7, 12)
	require.Equal(t, -10.0, min, "a negative value is on the axis")
	require.Equal(t, "-10", ticks[0].Label)
	_, max, ticks = valueAxis(0, 2.5e6)
	require.Equal(t, 2.5e6, max)
	require.Equal(t, []string{"0", "0.5M", "1.0M", "1.5M", "2.0M", "2.5M"}, labels(ticks), "one unit on the whole axis")
	_, _, ticks = valueAxis(0, 4200)
	require.Equal(t, []string{"0", "1000", "2000", "3000", "4000", "5000"}, labels(ticks))
}
