// Package faultproxy is a TCP proxy for fault-injection tests. It sits
// between Redis clients and a real redis-server and, on request, resets
// connections at random points, cuts a connection right after it forwarded
// an EXEC to the server but before the reply comes back (the ambiguous
// outcome a client cannot tell from a lost write), adds latency, and
// partitions its clients from the server (see [Proxy.Partition]).
//
// It is written here rather than taken from toxiproxy because the one fault
// that matters most, "the EXEC ran but its reply was lost", needs a proxy
// that knows where an EXEC is in the stream.
package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are the current fault rates. The zero value passes traffic
// through untouched.
type Faults struct {
	ResetProb   float64       // per forwarded chunk, either way: reset the connection
	ExecCutProb float64       // per chunk holding an EXEC: forward it, then drop the reply
	Latency     time.Duration // added before every forwarded chunk
}

// Counts are what the proxy did.
type Counts struct {
	Conns, Resets, ExecCuts, Kills int64
	Partitions                     int64 // partitions started by Partition(true)
}

// Proxy forwards one listening address to one target.
type Proxy struct {
	Addr   string // listening address, host:port
	target string
	ln     net.Listener

	mu     sync.Mutex
	faults Faults
	conns  map[*link]struct{}
	closed bool
	healed chan struct{} // non-nil while partitioned; closed when the partition heals

	nConns, resets, execCuts, kills, partitions atomic.Int64
	wg                                          sync.WaitGroup // every goroutine the proxy starts
}

type link struct {
	client, server net.Conn
	once           sync.Once
	dead           chan struct{} // closed by close: ends a wait for a partition to heal
	cut            atomic.Bool   // an EXEC went through; drop what comes back
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.dead)
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not a polite close
			}
			_ = c.Close()
		}
	})
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Set replaces the fault rates. It leaves a partition as it is.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// current returns the fault rates, and while partitioned a channel that is
// closed when the partition heals (nil otherwise).
func (p *Proxy) current() (Faults, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults, p.healed
}

// Partition starts (on) or heals (!on) a network partition between every
// client of this proxy and the server. It is a switch apart from Set, so
// that a harness changing the fault rates never heals a partition by
// accident; starting a partition that is on, or healing one that is off,
// does nothing.
//
// While the partition is on, no byte is forwarded in either direction, on
// open connections and on new ones alike. New connections are still
// accepted (and the proxy still connects them to the server) but nothing
// passes: as in a real partition, a client sees its reads time out, never
// a reset or an EOF. Each direction of a connection holds the chunk it read
// last and stops reading, so what a client writes beyond that waits in the
// kernel's socket buffers, and a client that writes a lot eventually
// blocks, as it would once the TCP window filled. A chunk the proxy is
// already writing when the partition starts still goes through, like a
// packet already on the wire.
//
// When the partition heals, everything held is delivered late and in
// order, as TCP retransmission would deliver it: a command written during
// the partition reaches the server after it heals, even if the client has
// closed its connection meanwhile (its close arrives after its data, as a
// FIN would), and the server's answer is then lost with the connection.
// The one exception is a client that reset its connection (closing it with
// unread data, or SO_LINGER 0): the chunk the proxy holds is still
// delivered, but what the kernel held behind it may be discarded with the
// reset. Latency and the other faults apply to held bytes as usual once they
// move.
//
// KillAll and Close end the partition's waits: a killed connection's held
// bytes are dropped, and Close returns promptly with every goroutine of the
// proxy finished, partition or not.
func (p *Proxy) Partition(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.healed == nil:
		p.healed = make(chan struct{})
		p.partitions.Add(1)
	case !on && p.healed != nil:
		close(p.healed)
		p.healed = nil
	}
}

// Counts returns what the proxy did so far.
func (p *Proxy) Counts() Counts {
	return Counts{
		Conns: p.nConns.Load(), Resets: p.resets.Load(), ExecCuts: p.execCuts.Load(), Kills: p.kills.Load(),
		Partitions: p.partitions.Load(),
	}
}

// KillAll resets every open connection.
func (p *Proxy) KillAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	p.kills.Add(int64(len(links)))
}

// Close stops listening and resets every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.KillAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s, dead: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.nConns.Add(1)
		p.wg.Add(2)
		go p.pipe(l, c, s, true)
		go p.pipe(l, s, c, false)
	}
}

var execCmd = []byte("\r\nexec\r\n")

// pipe copies one direction, injecting faults.
func (p *Proxy) pipe(l *link, from, to net.Conn, upstream bool) {
	defer p.wg.Done()
	halfClosed := false
	defer func() {
		if halfClosed {
			return // the other direction closes the link when it ends
		}
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			f, healed := p.current()
			if f.Latency > 0 {
				time.Sleep(f.Latency)
				f, healed = p.current()
			}
			for healed != nil { // partitioned: hold the chunk until the partition heals
				select {
				case <-healed:
				case <-l.dead:
					return // killed or closed meanwhile: the held chunk is dropped
				}
				f, healed = p.current() // a new partition may have started since
			}
			if !upstream && l.cut.Load() {
				p.execCuts.Add(1)
				return // the server answered; the client never hears it
			}
			if f.ResetProb > 0 && rand.Float64() < f.ResetProb {
				p.resets.Add(1)
				return
			}
			// Marked before the EXEC goes on, so its reply cannot outrun the mark.
			if upstream && f.ExecCutProb > 0 && bytes.Contains(bytes.ToLower(buf[:n]), execCmd) && rand.Float64() < f.ExecCutProb {
				l.cut.Store(true)
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// The client's orderly close goes on to the server as one (a FIN
			// after the data), so the server still runs what came before it,
			// such as a command held by a partition. Anything else, and the
			// server closing, resets the link both ways.
			if upstream && errors.Is(err, io.EOF) {
				if tc, ok := to.(*net.TCPConn); ok && tc.CloseWrite() == nil {
					halfClosed = true
				}
			}
			return
		}
	}
}
