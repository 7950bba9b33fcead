package cas

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The EXEC round trip's commands are built once and sent again and again:
// go-redis would make a command object, an argument slice and, on reading,
// a string and a boxed value for each "+QUEUED" and each "+OK" of every
// command of every transaction (the burn-down's largest source of garbage
// after the values themselves). A pipe keeps command objects of go-redis's
// own (RawWriteToCmd, so go-redis still owns the connection, its
// deadlines, TLS, Cluster and Sentinel) whose arguments are set anew for
// each round trip, and which hand their replies over as raw RESP, which
// internal/resp reads without allocating for the common ones.

// pipes are the engine's pipes not in use: one goroutine uses a pipe at a
// time, from building its commands to reading its replies.
var pipes = sync.Pool{New: func() any { return &pipe{} }}

// pipe is one round trip's reusable commands, and the raw replies they
// read.
type pipe struct {
	cmds  []*rawCmd
	used  int
	batch []redis.Cmder
	in    sink // the raw replies of the round trip, in order
}

// getPipe returns a pipe ready for a round trip.
func getPipe() *pipe {
	p := pipes.Get().(*pipe)
	p.used, p.batch, p.in.b = 0, p.batch[:0], p.in.b[:0]
	return p
}

// maxKeptReplies bounds the reply buffer a pipe keeps between round trips:
// a rare large one is not held for good.
const maxKeptReplies = 1 << 20

// put gives p back once nothing refers to its commands or replies.
func (p *pipe) put() {
	for _, c := range p.cmds[:p.used] {
		c.args = nil // nothing of the plan is kept alive by the pool
	}
	if cap(p.in.b) > maxKeptReplies {
		p.in.b = nil
	}
	clear(p.batch)
	pipes.Put(p)
}

// cmd returns the pipe's next command, set to send args.
func (p *pipe) cmd(args []any) *rawCmd {
	if p.used == len(p.cmds) {
		c := &rawCmd{}
		// The placeholder arguments are never sent: Args is rawCmd's.
		c.RawWriteToCmd = redis.NewRawWriteToCmd(context.Background(), &p.in, "jobkey")
		p.cmds = append(p.cmds, c)
	}
	c := p.cmds[p.used]
	p.used++
	c.args = args
	c.SetErr(nil)
	c.SetVal(0)
	p.batch = append(p.batch, c)
	return c
}

// sink is where a RawWriteToCmd writes its raw reply: one buffer that
// the replies are appended to. A sink that expects an array of values
// (values > 0, an MGET's) sizes its buffer at the first value that does
// not fit for the values still to come, taking each to be as large as
// that one (values in a batch are mostly alike): one allocation of about
// the reply's size, however large the values are, and nothing carried
// over from other replies.
type sink struct {
	b      []byte
	values int // values expected in all
	bodies int // bulk bodies read so far
}

// maxLookahead bounds what a sink allocates ahead for values not read
// yet: a large first value does not make room for as many large ones.
const maxLookahead = 256 << 10

// Write appends a reply's bytes; go-redis's RawWriteToCmd writes them.
func (s *sink) Write(b []byte) (int, error) {
	s.b = append(s.b, b...)
	return len(b), nil
}

// ReadFrom appends what r reads: a bulk string's body, copied straight
// from go-redis's reader (without it io.Copy would make a buffer for each).
func (s *sink) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	if lr, ok := r.(*io.LimitedReader); ok && int64(cap(s.b)-len(s.b)) < lr.N && lr.N <= 1<<30 {
		need := lr.N
		if ahead := int64(s.values-s.bodies-1) * lr.N; ahead > 0 {
			need += min(ahead, maxLookahead)
		}
		s.b = slices.Grow(s.b, int(need))
	}
	s.bodies++
	for {
		if len(s.b) == cap(s.b) {
			s.b = append(s.b, 0)[:len(s.b)]
		}
		n, err := r.Read(s.b[len(s.b):cap(s.b)])
		s.b = s.b[:len(s.b)+n]
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// replies splits the pipe's raw replies by command: out[i] is the
// (i+1)th command's, in order. ok is false when some command has no
// whole reply (go-redis set its error, or a hook did).
func (p *pipe) replies(out [][]byte) (_ [][]byte, ok bool) {
	at := int64(0)
	for _, c := range p.cmds[:p.used] {
		if c.Err() != nil {
			return out, false
		}
		n := c.Val()
		if n <= 0 || at+n > int64(len(p.in.b)) {
			return out, false
		}
		out = append(out, p.in.b[at:at+n])
		at += n
	}
	return out, true
}

// rawCmd is a go-redis command object whose arguments are set for each
// round trip (Args is what go-redis writes), and whose reply is written
// raw to its pipe.
type rawCmd struct {
	*redis.RawWriteToCmd
	args []any
}

// Args returns the command as it is sent.
func (c *rawCmd) Args() []any { return c.args }

// Name returns the command's name, as hooks see it.
func (c *rawCmd) Name() string {
	if len(c.args) > 0 {
		if s, ok := c.args[0].(string); ok {
			return s
		}
	}
	return ""
}

// FullName is Name: jobkey sends no command with a subcommand this way.
func (c *rawCmd) FullName() string { return c.Name() }

// String describes the command, for hooks that log it.
func (c *rawCmd) String() string { return fmt.Sprint(c.args...) }
