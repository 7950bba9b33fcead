// Package svgchart draws line charts and horizontal bar charts as SVG
// documents with nothing but the standard library, so a program that
// draws its report's charts compiles no plotting, font or image packages.
// SVG is text: a browser opens it, GitHub shows it, and a test reads it
// back with encoding/xml.
//
// Every string a caller gives (a title, a label, a series name) is written
// as escaped character data, never into an attribute or as markup, so no
// label can add an element, a script or an attribute to the document.
// Attributes hold only numbers, colors and the package's own names.
// Non-finite values are left out of a chart rather than written as "NaN".
package svgchart

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image/color"
	"math"
	"strconv"
	"unicode/utf8"
)

// Font sizes, in pixels, of the chart's texts.
const (
	titleSize = 15
	labelSize = 12
	tickSize  = 11
)

// doc accumulates an SVG document. Its methods write numbers and colors
// into attributes and caller strings only as escaped text.
type doc struct {
	b bytes.Buffer
}

// open writes the root element and a white background, so the chart
// reads the same on a dark page.
func (d *doc) open(width, height float64) {
	fmt.Fprintf(&d.b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif">`+"\n",
		num(width), num(height), num(width), num(height))
	fmt.Fprintf(&d.b, `<rect class="background" x="0" y="0" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(width), num(height))
}

func (d *doc) close() { d.b.WriteString("</svg>\n") }

// escape writes s as XML character data: <, >, &, quotes and control
// characters are escaped, and bytes that are not valid UTF-8 (or runes XML
// forbids) become U+FFFD, so the document stays well-formed.
func (d *doc) escape(s string) {
	_ = xml.EscapeText(&d.b, []byte(s)) // a bytes.Buffer does not fail
}

// text writes s at (x, y). anchor is "start", "middle" or "end"; rotate,
// when not zero, turns the text by that many degrees around (x, y).
func (d *doc) text(class string, x, y float64, size int, anchor string, rotate float64, bold bool, s string) {
	fmt.Fprintf(&d.b, `<text class="%s" x="%s" y="%s" font-size="%d" text-anchor="%s"`, class, num(x), num(y), size, anchor)
	if rotate != 0 {
		fmt.Fprintf(&d.b, ` transform="rotate(%s %s %s)"`, num(rotate), num(x), num(y))
	}
	if bold {
		d.b.WriteString(` font-weight="bold"`)
	}
	d.b.WriteString(`>`)
	d.escape(s)
	d.b.WriteString("</text>\n")
}

// line writes a straight line.
func (d *doc) line(class string, x1, y1, x2, y2 float64, stroke string, width float64) {
	fmt.Fprintf(&d.b, `<line class="%s" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s"/>`+"\n",
		class, num(x1), num(y1), num(x2), num(y2), stroke, num(width))
}

// rect writes a filled rectangle, with title as its tooltip when not empty.
func (d *doc) rect(class string, x, y, w, h float64, fill string, title string) {
	d.elem("rect", fmt.Sprintf(`class="%s" x="%s" y="%s" width="%s" height="%s" fill="%s"`, class, num(x), num(y), num(w), num(h), fill), title)
}

// elem writes an element with the package's own attributes, self-closed
// without a title, else with a <title> child, which browsers show on
// hover. attrs never holds a caller's string.
func (d *doc) elem(name, attrs, title string) {
	fmt.Fprintf(&d.b, "<%s %s", name, attrs)
	if title == "" {
		d.b.WriteString("/>\n")
		return
	}
	d.b.WriteString("><title>")
	d.escape(title)
	fmt.Fprintf(&d.b, "</title></%s>\n", name)
}

// hex is c as #rrggbb; alpha is ignored.
func hex(c color.RGBA) string {
	return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B)
}

// num formats a coordinate or a size in pixels: at most two decimals,
// without trailing zeros.
func num(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// Value formats a data value for a label or a tooltip: whole numbers from
// 100 up, three significant digits below, never an exponent for the
// magnitudes a benchmark reports.
func Value(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100 || a == 0:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case a >= 0.001:
		return strconv.FormatFloat(v, 'g', 3, 64)
	default:
		return strconv.FormatFloat(v, 'e', 2, 64)
	}
}

// textWidth estimates the width in pixels of s at size: SVG has no text
// metrics before a browser renders it, and 0.6 em is a little above the
// average advance of sans-serif faces, so the layout errs on room.
func textWidth(s string, size int) float64 {
	return 0.6 * float64(size) * float64(utf8.RuneCountInString(s))
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
