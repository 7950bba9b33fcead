package asynqcompat

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// asynq stores each task as a hash whose "msg" field is its TaskMessage,
// protobuf-encoded (asynq's internal/proto, v0.26). A move into asynq
// writes the held copy itself, in the transaction that records the step,
// so that a copy exists exactly when the migration state says it does;
// asynq's Client cannot write in another's transaction.

// The field numbers of asynq's TaskMessage.
const (
	asynqTypeField         = 1
	asynqPayloadField      = 2
	asynqIDField           = 3
	asynqQueueField        = 4
	asynqRetryField        = 5
	asynqRetriedField      = 6
	asynqErrorMsgField     = 7
	asynqTimeoutField      = 8
	asynqDeadlineField     = 9
	asynqRetentionField    = 12
	asynqLastFailedAtField = 11
)

// asynqMsg is the part of asynq's TaskMessage a move into asynq sets; the
// other fields (headers, unique key, group) stay empty, as a task enqueued
// without those options has them.
type asynqMsg struct {
	Type         string
	Payload      []byte
	ID           string
	Queue        string
	Retry        int    // MaxRetry
	Retried      int    // retries spent
	ErrorMsg     string // the last error (TaskInfo.LastErr)
	LastFailedAt int64  // Unix seconds, 0 for none
	Timeout      int64  // seconds, 0 for none
	Deadline     int64  // Unix seconds, 0 for none
	Retention    int64  // seconds, 0 for none
}

// encode returns the message as asynq's proto.Marshal would: proto3, zero
// values left out.
func (m *asynqMsg) encode() []byte {
	var b []byte
	str := func(num protowire.Number, s string) {
		if s != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, s)
		}
	}
	varint := func(num protowire.Number, v int64) {
		if v != 0 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	str(asynqTypeField, m.Type)
	if len(m.Payload) > 0 {
		b = protowire.AppendTag(b, asynqPayloadField, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Payload)
	}
	str(asynqIDField, m.ID)
	str(asynqQueueField, m.Queue)
	varint(asynqRetryField, int64(int32(m.Retry)))
	varint(asynqRetriedField, int64(int32(m.Retried)))
	str(asynqErrorMsgField, m.ErrorMsg)
	varint(asynqTimeoutField, m.Timeout)
	varint(asynqDeadlineField, m.Deadline)
	varint(asynqLastFailedAtField, m.LastFailedAt)
	varint(asynqRetentionField, m.Retention)
	return b
}

// msgTypePayload returns the type and payload of an encoded task message.
func msgTypePayload(msg []byte) (typ string, payload []byte, err error) {
	m, err := decodeMsg(msg)
	if err != nil {
		return "", nil, err
	}
	return m.Type, m.Payload, nil
}

// decodeMsg decodes the fields of asynqMsg from an encoded task message,
// as proto.Unmarshal would; the fields it does not hold (headers, unique
// key, group, completion time) and unknown ones are skipped.
func decodeMsg(msg []byte) (*asynqMsg, error) {
	m := &asynqMsg{}
	for rest := msg; len(rest) > 0; {
		num, wt, tl := protowire.ConsumeTag(rest)
		if tl < 0 {
			return nil, fmt.Errorf("the task message cannot be decoded: %w", protowire.ParseError(tl))
		}
		vl := protowire.ConsumeFieldValue(num, wt, rest[tl:])
		if vl < 0 {
			return nil, fmt.Errorf("the task message cannot be decoded: %w", protowire.ParseError(vl))
		}
		switch wt {
		case protowire.BytesType:
			v, _ := protowire.ConsumeBytes(rest[tl:])
			switch num {
			case asynqTypeField:
				m.Type = string(v)
			case asynqPayloadField:
				m.Payload = v
			case asynqIDField:
				m.ID = string(v)
			case asynqQueueField:
				m.Queue = string(v)
			case asynqErrorMsgField:
				m.ErrorMsg = string(v)
			}
		case protowire.VarintType:
			u, _ := protowire.ConsumeVarint(rest[tl:])
			switch num {
			case asynqRetryField:
				m.Retry = int(int32(u)) // an int32 field, sign-extended on the wire
			case asynqRetriedField:
				m.Retried = int(int32(u))
			case asynqTimeoutField:
				m.Timeout = int64(u)
			case asynqDeadlineField:
				m.Deadline = int64(u)
			case asynqLastFailedAtField:
				m.LastFailedAt = int64(u)
			case asynqRetentionField:
				m.Retention = int64(u)
			}
		}
		rest = rest[tl+vl:]
	}
	return m, nil
}
