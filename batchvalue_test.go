package jobkey

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/msgpk"
	"github.com/stretchr/testify/require"
)

// fullBatch is a batch with every field set, for the golden file.
func fullBatch() *Batch {
	at := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	cb := &Job{ID: "01JDQ4ZBATCH0000000000000", Queue: "emails", Type: "report", Payload: []byte(`{"day":"2026-12-02"}`),
		State: StatePending, MaxAttempts: 3, Meta: map[string]string{"k": "v"}, Priority: 2, Batch: "01JDQ4ZNEXT00000000000000"}
	return &Batch{ID: cb.ID, Queue: "emails", Total: 10, Pending: 3, Succeeded: 5, Failed: 1, Canceled: 1,
		Condition: BatchAllSucceeded, Callback: cb, Fired: BatchNotFired, CreatedAt: at, After: "01JDQ4ZPREV00000000000000", Rev: 7}
}

// goldenBatchV10 is the value this build writes for fullBatch, checked in.
func goldenBatchV10(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join("testdata", "batch-v1.0.msgpack")
	if *updateGolden {
		b, err := encodeBatch(fullBatch())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestBatchValueGolden(t *testing.T) {
	t.Parallel()
	golden := goldenBatchV10(t)
	got, err := decodeBatch(string(golden))
	require.NoError(t, err)
	require.Equal(t, fullBatch(), got)
	again, err := encodeBatch(got)
	require.NoError(t, err)
	require.Equal(t, golden, again, "the current encoder writes v1.0 byte for byte")
	require.Equal(t, []byte{0xdc, 0, batchFields, 1, 0}, golden[:5], "array16 of 16, version 1.0")
}

// A batch value of a newer minor version decodes, and its appended fields
// are written back as they were.
func TestBatchValueNewerMinorKeepsItsFields(t *testing.T) {
	t.Parallel()
	b, err := encodeBatch(fullBatch())
	require.NoError(t, err)
	newer := msgpk.AppendArrayHdr(nil, batchFields+2)
	newer = append(newer, 1, 3) // version 1.3
	newer = append(newer, b[5:]...)
	newer = msgpk.AppendStr(newer, "a field of 1.3")
	newer = msgpk.AppendInt(newer, -5)
	got, err := decodeBatch(string(newer))
	require.NoError(t, err)
	require.Equal(t, 7, got.Pending+got.Succeeded-got.Failed)
	again, err := encodeBatch(got)
	require.NoError(t, err)
	require.Equal(t, newer, again)
}

func TestBatchValueCorruptIsReported(t *testing.T) {
	t.Parallel()
	good, err := encodeBatch(fullBatch())
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"empty":     {},
		"truncated": good[:len(good)-3],
		"trailing":  append(bytes.Clone(good), 0),
		"short":     {0x92, 1, 0},
		"notArray":  {0xa1, 'x'},
	} {
		_, err := decodeBatch(string(b))
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
	newer := bytes.Clone(good)
	newer[3] = 2
	_, err = decodeBatch(string(newer))
	require.ErrorIs(t, err, ErrUnsupportedFormat)
}
