package jobkey

import (
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// benchPayloads are the payload sizes every benchmark in this package uses.
var benchPayloads = []int{64, 1 << 10, 16 << 10, 256 << 10}

func sizeName(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func benchJob(size int) *Job {
	j := fullJob()
	j.Payload = make([]byte, size)
	for i := range j.Payload {
		j.Payload[i] = byte(i)
	}
	return j
}

// BenchmarkCodec compares the hand-written codec with msgpack's reflective
// Marshal/Unmarshal of the same struct. Compare with benchstat:
//
//	go test -run '^$' -bench BenchmarkCodec -count 10 . | benchstat -col /impl -
func BenchmarkCodec(b *testing.B) {
	for _, size := range benchPayloads {
		j := benchJob(size)
		enc, _ := Marshal(j)
		refl, _ := msgpack.Marshal(j)
		b.Run(fmt.Sprintf("op=encode/impl=jobkey/payload=%s", sizeName(size)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			for b.Loop() {
				if _, err := Marshal(j); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("op=encode/impl=reflect/payload=%s", sizeName(size)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(refl)))
			for b.Loop() {
				if _, err := msgpack.Marshal(j); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("op=decode/impl=jobkey/payload=%s", sizeName(size)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			var out Job
			for b.Loop() {
				if err := Unmarshal(enc, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("op=decode/impl=reflect/payload=%s", sizeName(size)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(refl)))
			for b.Loop() {
				var out Job
				if err := msgpack.Unmarshal(refl, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMarshalAllocatesOnlyOutput holds the codec to its promise: encoding
// makes exactly one allocation, the output buffer.
func TestMarshalAllocatesOnlyOutput(t *testing.T) {
	j := benchJob(1 << 10)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Marshal(j); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 1 {
		t.Fatalf("Marshal made %v allocations per call, want exactly 1 (the output)", allocs)
	}
}
