package bench_test

import (
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
)

// TestMain stops the redis-server the tests share when they end.
func TestMain(m *testing.M) { redistest.Main(m) }

// realURL is the URL of the tests' real Redis; the test is skipped, or
// fails in CI, without one.
func realURL(tb testing.TB) string {
	tb.Helper()
	return redistest.RequireReal(tb).URL
}
