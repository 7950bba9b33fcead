// Package ulid draws ULIDs (https://github.com/ulid/spec): 48 bits of Unix
// milliseconds and 80 random bits, in 26 characters of Crockford's base32,
// so IDs sort by the time they were drawn. Within one millisecond a
// generator adds one to the last random part, as the spec's monotonic mode
// does, so IDs drawn by one process also sort in the order they were drawn.
package ulid

import (
	"crypto/rand"
	"sync"
	"time"
)

const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// Len is the length of a ULID's text.
const Len = 26

// maxTime is the largest timestamp a ULID holds (48 bits of milliseconds).
const maxTime = 1<<48 - 1

// Generator draws monotonic ULIDs. Its zero value is ready to use and safe
// for concurrent use.
type Generator struct {
	mu   sync.Mutex
	last uint64   // the millisecond of the last ULID drawn
	rnd  [10]byte // its random part
	// read fills b with random bytes; nil means crypto/rand.
	read func(b []byte)
}

// New returns a ULID for time t.
func (g *Generator) New(t time.Time) string {
	ms := uint64(max(t.UnixMilli(), 0))
	if ms > maxTime {
		ms = maxTime
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if ms <= g.last && g.last != 0 && g.increment() {
		ms = g.last // same millisecond (or the clock stepped back): keep order
	} else {
		g.fill()
		g.last = ms
	}
	return encode(ms, &g.rnd)
}

// increment adds one to the random part; it reports false when it would
// overflow, and the caller then draws afresh.
func (g *Generator) increment() bool {
	for i := len(g.rnd) - 1; i >= 0; i-- {
		g.rnd[i]++
		if g.rnd[i] != 0 {
			return true
		}
	}
	return false
}

func (g *Generator) fill() {
	if g.read != nil {
		g.read(g.rnd[:])
		return
	}
	_, _ = rand.Read(g.rnd[:]) // crypto/rand.Read never fails (Go 1.24+)
}

// encode writes the 128 bits (ms in the top 48, rnd below) as 26 base32
// characters, most significant first; the first character carries 3 bits.
func encode(ms uint64, rnd *[10]byte) string {
	var b [16]byte
	for i := range 6 {
		b[i] = byte(ms >> (8 * (5 - i)))
	}
	copy(b[6:], rnd[:])
	var out [Len]byte
	// 128 bits as 26 groups of 5, after 2 leading zero bits.
	var acc uint
	bits := 2 // the first group has two implied zero bits
	n := 0
	for _, c := range b {
		acc = acc<<8 | uint(c)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out[n] = alphabet[(acc>>bits)&31]
			n++
		}
	}
	return string(out[:])
}

// Time returns the millisecond timestamp of a ULID's text, and false when s
// is not a ULID.
func Time(s string) (time.Time, bool) {
	if len(s) != Len {
		return time.Time{}, false
	}
	var ms uint64
	for i := range 10 {
		v := decodeChar(s[i])
		if v < 0 || (i == 0 && v > 7) {
			return time.Time{}, false
		}
		ms = ms<<5 | uint64(v)
	}
	for i := 10; i < Len; i++ {
		if decodeChar(s[i]) < 0 {
			return time.Time{}, false
		}
	}
	return time.UnixMilli(int64(ms)), true
}

func decodeChar(c byte) int {
	for i := range len(alphabet) {
		if alphabet[i] == c {
			return i
		}
	}
	return -1
}
