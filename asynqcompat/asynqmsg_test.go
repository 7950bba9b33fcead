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
	}
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
