package ulid

import (
	"sort"
	"strings"
	"testing"
	"time"
)

func TestULIDEncodesTimeAndRandomBitsInCrockfordBase32(t *testing.T) {
	// The spec's layout: 48 bits of milliseconds then 80 random bits. All
	// ones in both gives the largest ULID, "7ZZZZZZZZZZZZZZZZZZZZZZZZZ".
	var ones [10]byte
	for i := range ones {
		ones[i] = 0xff
	}
	if got := encode(maxTime, &ones); got != "7ZZZZZZZZZZZZZZZZZZZZZZZZZ" {
		t.Fatalf("largest ULID = %s", got)
	}
	var zero [10]byte
	if got := encode(0, &zero); got != strings.Repeat("0", Len) {
		t.Fatalf("zero ULID = %s", got)
	}
	// 1 ms and random part 1: the last character and the tenth carry them.
	one := [10]byte{9: 1}
	if got := encode(1, &one); got != "0000000001"+"0000000000000001" {
		t.Fatalf("ULID(1 ms, 1) = %s", got)
	}
}

func TestULIDTimeRoundTrips(t *testing.T) {
	var g Generator
	now := time.UnixMilli(time.Now().UnixMilli())
	id := g.New(now)
	got, ok := Time(id)
	if !ok || !got.Equal(now) {
		t.Fatalf("Time(%s) = %v, %v; want %v", id, got, ok, now)
	}
	for _, bad := range []string{"", "short", strings.Repeat("U", Len), "8" + strings.Repeat("0", Len-1)} {
		if _, ok := Time(bad); ok {
			t.Errorf("Time(%q) accepted", bad)
		}
	}
}

func TestULIDsDrawnInOneMillisecondSortInDrawOrder(t *testing.T) {
	var g Generator
	at := time.Now()
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = g.New(at)
	}
	if !sort.StringsAreSorted(ids) {
		t.Fatal("ULIDs of one millisecond are not in draw order")
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("ULID %s drawn twice", id)
		}
		seen[id] = true
	}
}

func TestULIDsKeepOrderWhenTheClockStepsBack(t *testing.T) {
	var g Generator
	now := time.Now()
	a := g.New(now)
	b := g.New(now.Add(-time.Second))
	if b <= a {
		t.Fatalf("after the clock stepped back, %s sorts before %s", b, a)
	}
}

func TestULIDRandomPartOverflowDrawsAfresh(t *testing.T) {
	calls := 0
	g := Generator{read: func(b []byte) {
		calls++
		for i := range b {
			b[i] = 0xff // the first draw: the largest random part
			if calls > 1 {
				b[i] = 0x11
			}
		}
	}}
	at := time.UnixMilli(5)
	first := g.New(at)
	second := g.New(at) // one more would overflow: it draws again
	if calls != 2 || first == second || second[10:] != "248H248H248H248H" {
		t.Fatalf("calls %d, first %s, second %s", calls, first, second)
	}
}

func TestULIDsOfLaterMillisecondsSortLater(t *testing.T) {
	var g Generator
	a := g.New(time.UnixMilli(1000))
	b := g.New(time.UnixMilli(1001))
	if b <= a {
		t.Fatalf("%s does not sort after %s", b, a)
	}
}

func BenchmarkULID(b *testing.B) {
	var g Generator
	now := time.Now()
	for b.Loop() {
		g.New(now)
	}
}
