package jobkey

import (
	"maps"
	"slices"

	"github.com/jobkey/jobkey/internal/msgpk"
)

// encodedSize is the exact length appendJob produces, so Marshal allocates
// once and oversized jobs are refused before any encoding work.
func encodedSize(j *Job) int { return encodedSizeAs(j, knownFields) }

// encodedSizeAs is encodedSize for a build that knows the first known
// fields (see decodeJobAs).
func encodedSizeAs(j *Job, known int) int {
	n := msgpk.ArrayHdrSize(known+j.future.n) +
		msgpk.UintSize(formatMajor) + msgpk.UintSize(j.minorAs(known)) +
		msgpk.StrSize(j.ID) + msgpk.StrSize(j.Queue) + msgpk.StrSize(j.Type) + msgpk.BinSize(len(j.Payload)) +
		msgpk.UintSize(uint64(j.State)) + msgpk.IntSize(int64(j.Attempt)) + msgpk.IntSize(int64(j.MaxAttempts)) +
		msgpk.IntSize(toMillis(j.RunAt)) + msgpk.StrSize(j.LeaseOwner) + msgpk.IntSize(toMillis(j.LeaseUntil)) +
		msgpk.StrSize(j.LastError) + msgpk.BinSize(len(j.Result)) +
		msgpk.IntSize(toMillis(j.CreatedAt)) + msgpk.IntSize(toMillis(j.UpdatedAt)) + msgpk.UintSize(j.Rev) +
		msgpk.UintSize(j.LeaseToken) + len(j.future.raw)
	if known > v1Fields+1 {
		n += metaSize(j.Meta)
	}
	if known > v1Fields+2 {
		n += msgpk.IntSize(j.Timeout.Milliseconds())
	}
	if known > v1Fields+3 {
		n += msgpk.UintSize(uint64(j.Priority))
	}
	if known > v1Fields+4 {
		n += msgpk.StrSize(j.ConcurrencyKey)
	}
	if known > v1Fields+5 {
		n += msgpk.IntSize(j.Retention.Milliseconds())
	}
	if known > v1Fields+6 {
		n += msgpk.IntSize(toMillis(j.Deadline))
	}
	if known > v1Fields+11 {
		n += msgpk.UintSize(uint64(j.Snoozes)) + msgpk.IntSize(toMillis(j.StartedAt)) + historySize(j.History) +
			msgpk.UintSize(uint64(j.HistoryDropped)) + msgpk.BinSize(len(j.Progress))
	}
	if known > v1Fields+12 {
		n += msgpk.StrSize(j.Batch)
	}
	return n
}

// appendJob writes the v1 array. The field order is the wire format: new
// fields may only be appended, in a new minor version.
func appendJob(b []byte, j *Job) []byte { return appendJobAs(b, j, knownFields) }

// appendJobAs writes j as a build that knows the first known fields would
// (see decodeJobAs): an older build writes the fields it knows, then the
// ones it kept raw.
func appendJobAs(b []byte, j *Job, known int) []byte {
	b = msgpk.AppendArrayHdr(b, known+j.future.n)
	b = msgpk.AppendUint(b, formatMajor)
	b = msgpk.AppendUint(b, j.minorAs(known))
	b = msgpk.AppendStr(b, j.ID)
	b = msgpk.AppendStr(b, j.Queue)
	b = msgpk.AppendStr(b, j.Type)
	b = msgpk.AppendBin(b, j.Payload)
	b = msgpk.AppendUint(b, uint64(j.State))
	b = msgpk.AppendInt(b, int64(j.Attempt))
	b = msgpk.AppendInt(b, int64(j.MaxAttempts))
	b = msgpk.AppendInt(b, toMillis(j.RunAt))
	b = msgpk.AppendStr(b, j.LeaseOwner)
	b = msgpk.AppendInt(b, toMillis(j.LeaseUntil))
	b = msgpk.AppendStr(b, j.LastError)
	b = msgpk.AppendBin(b, j.Result)
	b = msgpk.AppendInt(b, toMillis(j.CreatedAt))
	b = msgpk.AppendInt(b, toMillis(j.UpdatedAt))
	b = msgpk.AppendUint(b, j.Rev)
	b = msgpk.AppendUint(b, j.LeaseToken) // 1.1
	if known > v1Fields+1 {
		b = appendMeta(b, j.Meta) // 1.2
	}
	if known > v1Fields+2 {
		b = msgpk.AppendInt(b, j.Timeout.Milliseconds()) // 1.3
	}
	if known > v1Fields+3 {
		b = msgpk.AppendUint(b, uint64(j.Priority)) // 1.4
	}
	if known > v1Fields+4 {
		b = msgpk.AppendStr(b, j.ConcurrencyKey) // 1.5
	}
	if known > v1Fields+5 {
		b = msgpk.AppendInt(b, j.Retention.Milliseconds()) // 1.6
	}
	if known > v1Fields+6 {
		b = msgpk.AppendInt(b, toMillis(j.Deadline)) // 1.6
	}
	if known > v1Fields+11 { // 1.7
		b = msgpk.AppendUint(b, uint64(j.Snoozes))
		b = msgpk.AppendInt(b, toMillis(j.StartedAt))
		b = appendHistory(b, j.History)
		b = msgpk.AppendUint(b, uint64(j.HistoryDropped))
		b = msgpk.AppendBin(b, j.Progress)
	}
	if known > v1Fields+12 {
		b = msgpk.AppendStr(b, j.Batch) // 1.8
	}
	return append(b, j.future.raw...)
}

// metaSize is the length appendMeta produces.
func metaSize(m map[string]string) int {
	n := msgpk.MapHdrSize(len(m))
	for k, v := range m {
		n += msgpk.StrSize(k) + msgpk.StrSize(v)
	}
	return n
}

// appendMeta writes m as a msgpack map of strings, keys in byte order so a
// job always encodes to the same bytes. An empty or nil map is one byte.
func appendMeta(b []byte, m map[string]string) []byte {
	b = msgpk.AppendMapHdr(b, len(m))
	if len(m) == 0 {
		return b
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = msgpk.AppendStr(msgpk.AppendStr(b, k), m[k])
	}
	return b
}
