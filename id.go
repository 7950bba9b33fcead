package jobkey

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// MaxIDLen bounds a job ID, which is part of a Redis key.
const MaxIDLen = 512

// validID checks a caller's job ID.
func validID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: job ID is empty", ErrInvalid)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: job ID is %d bytes, limit %d", ErrInvalid, len(id), MaxIDLen)
	}
	if strings.ContainsAny(id, "{}") {
		return fmt.Errorf("%w: job ID %q contains a brace", ErrInvalid, id)
	}
	return nil
}

var (
	ulidMu      sync.Mutex
	ulidEntropy = ulid.Monotonic(rand.Reader, 0)
)

// NewID returns a new ULID: unique, and sortable by creation time.
func NewID() string {
	ulidMu.Lock()
	defer ulidMu.Unlock()
	ts := ulid.Timestamp(time.Now())
	id, err := ulid.New(ts, ulidEntropy)
	if err != nil { // the monotonic counter overflowed within one millisecond
		ulidEntropy = ulid.Monotonic(rand.Reader, 0)
		id, err = ulid.New(ts, ulidEntropy)
	}
	if err != nil {
		var b [16]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	return id.String()
}

// ContentID derives a job ID from a job's type and payload, so enqueueing the
// same work twice with it is deduplicated: the second Enqueue returns
// ErrJobExists and the first job.
func ContentID(typ string, payload []byte) string {
	h := sha256.New()
	_, _ = h.Write([]byte(typ))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(payload)
	return "c-" + hex.EncodeToString(h.Sum(nil)[:16])
}
