// Package resp reads Redis replies from their raw RESP2 or RESP3 bytes,
// as go-redis's RawWriteToCmd hands them over: the engine reads the
// replies of its EXEC round trip with it, without the strings and boxed
// values go-redis's own reader allocates for each "+QUEUED" and "+OK".
//
// It never panics on what it is given: a reply cut short or malformed is
// an error (ErrMalformed), and an aggregate deeper than MaxDepth is
// refused.
package resp

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"strconv"
)

// Error is an error reply of Redis's (a "-" or "!" reply). It is a
// redis.Error to go-redis's helpers (it has RedisError), so code that tells
// Redis's replies from network errors treats it as go-redis's own.
type Error string

func (e Error) Error() string { return string(e) }

// RedisError marks Error as a reply of Redis's (go-redis's redis.Error).
func (Error) RedisError() {}

// ErrMalformed is what Next returns for bytes that are not one whole reply.
var ErrMalformed = errors.New("resp: malformed reply")

// MaxDepth bounds how deeply aggregates may nest.
const MaxDepth = 16

// Replies that come often, returned without an allocation.
const (
	OK     = "OK"
	Queued = "QUEUED"
)

// Next parses the reply at the start of b and returns its value and the
// bytes after it. Values are as go-redis's Cmd.Val gives them: string for
// simple and bulk strings, int64, float64, bool, *big.Int, []any for
// arrays, sets and pushes, map[any]any for maps, nil for a null, and Error
// for an error reply (returned as the value, not as err: err is only for
// bytes that are not a reply).
func Next(b []byte) (v any, rest []byte, err error) {
	return next(b, 0)
}

func next(b []byte, depth int) (any, []byte, error) {
	if depth > MaxDepth {
		return nil, nil, fmt.Errorf("%w: nested deeper than %d", ErrMalformed, MaxDepth)
	}
	line, rest, err := readLine(b)
	if err != nil {
		return nil, nil, err
	}
	if len(line) == 0 {
		return nil, nil, fmt.Errorf("%w: empty line", ErrMalformed)
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return status(body), rest, nil
	case '-':
		return Error(body), rest, nil
	case ':':
		n, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: integer %q", ErrMalformed, body)
		}
		return n, rest, nil
	case '_':
		return nil, rest, nil
	case ',':
		f, err := parseFloat(body)
		if err != nil {
			return nil, nil, err
		}
		return f, rest, nil
	case '#':
		switch string(body) {
		case "t":
			return true, rest, nil
		case "f":
			return false, rest, nil
		}
		return nil, nil, fmt.Errorf("%w: boolean %q", ErrMalformed, body)
	case '(':
		n, ok := new(big.Int).SetString(string(body), 10)
		if !ok {
			return nil, nil, fmt.Errorf("%w: big number %q", ErrMalformed, body)
		}
		return n, rest, nil
	case '$', '!', '=':
		s, rest, null, err := bulk(body, rest)
		if err != nil || null {
			return nil, rest, err
		}
		switch line[0] {
		case '!':
			return Error(s), rest, nil
		case '=':
			if len(s) < 4 || s[3] != ':' {
				return nil, nil, fmt.Errorf("%w: verbatim string %q", ErrMalformed, s)
			}
			return string(s[4:]), rest, nil
		}
		return string(s), rest, nil
	case '*', '~', '>':
		n, null, err := length(body, len(rest))
		if err != nil || null {
			return nil, rest, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], rest, err = next(rest, depth+1); err != nil {
				return nil, nil, err
			}
		}
		return out, rest, nil
	case '%':
		n, null, err := length(body, len(rest)/2)
		if err != nil || null {
			return nil, rest, err
		}
		out := make(map[any]any, n)
		for range n {
			var k, v any
			if k, rest, err = next(rest, depth+1); err != nil {
				return nil, nil, err
			}
			if v, rest, err = next(rest, depth+1); err != nil {
				return nil, nil, err
			}
			if !comparable(k) {
				return nil, nil, fmt.Errorf("%w: a map key of type %T", ErrMalformed, k)
			}
			out[k] = v
		}
		return out, rest, nil
	case '|':
		// An attribute: its pairs are metadata, and the reply follows.
		n, _, err := length(body, len(rest)/2)
		if err != nil {
			return nil, nil, err
		}
		for range 2 * n {
			if _, rest, err = next(rest, depth+1); err != nil {
				return nil, nil, err
			}
		}
		return next(rest, depth+1)
	}
	return nil, nil, fmt.Errorf("%w: type %q", ErrMalformed, line[0])
}

// NextBulk parses the reply at the start of b as a bulk string: its body
// (a slice of b, not a copy), or null for a null; any other reply is
// returned as other (an Error for an error reply).
func NextBulk(b []byte) (s []byte, null bool, other any, rest []byte, err error) {
	if len(b) > 0 && b[0] == '$' {
		line, rest, err := readLine(b)
		if err != nil {
			return nil, false, nil, nil, err
		}
		s, rest, null, err := bulk(line[1:], rest)
		return s, null, nil, rest, err
	}
	v, rest, err := Next(b)
	if err == nil && v == nil {
		return nil, true, nil, rest, nil
	}
	return nil, false, v, rest, err
}

// Header reads the line of an array reply at the start of b: its length
// and the bytes after the line; null is a null array ("*-1" or "_").
func Header(b []byte) (n int, null bool, rest []byte, err error) {
	line, rest, err := readLine(b)
	if err != nil {
		return 0, false, nil, err
	}
	switch {
	case len(line) == 1 && line[0] == '_':
		return 0, true, rest, nil
	case len(line) > 1 && line[0] == '*':
		n, null, err := length(line[1:], len(rest))
		return n, null, rest, err
	}
	return 0, false, nil, fmt.Errorf("%w: not an array: %q", ErrMalformed, truncate(line))
}

// status returns a simple string as Next's value, the common ones without
// an allocation: a constant converted to any is boxed once, at build time,
// where a string variable returned as any is boxed on the heap each time.
func status(b []byte) any {
	switch string(b) { // compared without a conversion
	case OK:
		return OK
	case Queued:
		return Queued
	}
	return string(b)
}

func readLine(b []byte) (line, rest []byte, err error) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return nil, nil, fmt.Errorf("%w: no line ending", ErrMalformed)
	}
	return b[:i-1], b[i+1:], nil
}

// length reads an aggregate's or a bulk string's length; -1 is a null
// (RESP2). A length above limit cannot be followed by that many replies
// (each takes three bytes or more) and is refused before anything is made
// for it.
func length(b []byte, limit int) (n int, null bool, err error) {
	v, err := strconv.ParseInt(string(b), 10, 64)
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("%w: length %q", ErrMalformed, b)
	case v == -1:
		return 0, true, nil
	case v < 0 || v > int64(limit):
		return 0, false, fmt.Errorf("%w: length %d", ErrMalformed, v)
	}
	return int(v), false, nil
}

// bulk reads a bulk string's body from rest, its length line being head.
func bulk(head, rest []byte) (s, after []byte, null bool, err error) {
	n, null, err := length(head, len(rest))
	if err != nil || null {
		return nil, rest, null, err
	}
	if len(rest) < n+2 || rest[n] != '\r' || rest[n+1] != '\n' {
		return nil, nil, false, fmt.Errorf("%w: bulk string of %d bytes cut short", ErrMalformed, n)
	}
	return rest[:n], rest[n+2:], false, nil
}

func parseFloat(b []byte) (float64, error) {
	switch string(b) {
	case "inf":
		return strconv.ParseFloat("+Inf", 64)
	case "-inf":
		return strconv.ParseFloat("-Inf", 64)
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, fmt.Errorf("%w: double %q", ErrMalformed, b)
	}
	return f, nil
}

func comparable(v any) bool {
	switch v.(type) {
	case []any, map[any]any:
		return false
	}
	return true
}

func truncate(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}
