package asynqcompat

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
)

// The held copy a move into asynq writes is, byte for byte, the message
// asynq's own Client writes for the same task.
func TestAsynqMsgIsWhatAsynqsClientWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	for _, c := range []struct {
		id      string
		payload []byte
		opts    []asynq.Option
		msg     asynqMsg
	}{
		{"a", []byte("p"), []asynq.Option{asynq.MaxRetry(4), asynq.Timeout(90 * time.Second)},
			asynqMsg{Retry: 4, Timeout: 90}},
		{"b", nil, nil, asynqMsg{Retry: DefaultMaxRetry, Timeout: int64(asynqDefaultTimeout / time.Second)}},
		{"c", []byte{0, 1, 2}, []asynq.Option{asynq.MaxRetry(0), asynq.Queue("low")},
			asynqMsg{Queue: "low", Timeout: int64(asynqDefaultTimeout / time.Second)}},
	} {
		opts := append([]asynq.Option{asynq.TaskID(c.id), asynq.ProcessAt(holdUntil)}, c.opts...)
		_, err := ac.EnqueueContext(e.ctx, asynq.NewTask(moveType, c.payload), opts...)
		require.NoError(t, err)
		m := c.msg
		m.Type, m.Payload, m.ID = moveType, c.payload, c.id
		if m.Queue == "" {
			m.Queue = "default"
		}
		got, err := e.rdb.HGet(e.ctx, asynqTaskKey(m.Queue, c.id), "msg").Bytes()
		require.NoError(t, err)
		require.Equal(t, got, m.encode(), c.id)
		typ, payload, err := msgTypePayload(got)
		require.NoError(t, err)
		require.Equal(t, moveType, typ)
		require.Equal(t, string(c.payload), string(payload))
		dec, err := decodeMsg(got)
		require.NoError(t, err)
		require.Equal(t, &m, dec, "what asynq's Client wrote decodes to the fields it was given")
	}
}

// Any bytes decode to an error or to a message that encodes and decodes
// back to itself, never a panic.
func FuzzDecodeMsg(f *testing.F) {
	f.Add((&asynqMsg{Type: "t", Payload: []byte("p"), ID: "i", Queue: "q", Retry: 3, Retried: 1, ErrorMsg: "e",
		LastFailedAt: 1700000000, Timeout: 5, Deadline: 1800000000, Retention: 60}).encode())
	f.Add((&asynqMsg{Retry: -1, Retried: -7}).encode())
	f.Add([]byte{})
	f.Add([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMsg(b)
		if err != nil {
			return
		}
		again, err := decodeMsg(m.encode())
		if err != nil {
			t.Fatalf("decode of the encoding of %+v: %v", m, err)
		}
		if len(m.Payload) == 0 {
			m.Payload = nil // encode leaves an empty payload out
		}
		require.Equal(t, m, again)
	})
}

// Any bytes decode to an error or to a type and payload, never a panic;
// an encoded message decodes to its own.
func FuzzMsgTypePayload(f *testing.F) {
	f.Add((&asynqMsg{Type: "t", Payload: []byte("p"), ID: "i", Queue: "q", Retry: 3, Retried: 1, ErrorMsg: "e", Timeout: 5}).encode())
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, payload, err := msgTypePayload(b)
		if err != nil {
			return
		}
		m := asynqMsg{Type: typ, Payload: payload, Retry: 2}
		typ2, payload2, err := msgTypePayload(m.encode())
		if err != nil || typ2 != typ || string(payload2) != string(payload) {
			t.Fatalf("round trip of %q/%q: %q/%q, %v", typ, payload, typ2, payload2, err)
		}
	})
}
