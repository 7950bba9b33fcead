package jobkey

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/ulid"
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

// ids draws the IDs NewID returns.
var ids ulid.Generator

// NewID returns a new ULID (https://github.com/ulid/spec): unique, and
// sortable by creation time; IDs drawn by one process sort in the order they
// were drawn.
func NewID() string { return ids.New(time.Now()) }

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
