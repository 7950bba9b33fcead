// Package faultproxy is a TCP proxy for fault-injection tests. It sits
// between Redis clients and a real redis-server and, on request, resets
// connections at random points, cuts a connection right after it forwarded
// an EXEC to the server but before the reply comes back (the ambiguous
// outcome a client cannot tell from a lost write), and adds latency.
//
// It is written here rather than taken from toxiproxy because the one fault
// that matters most, "the EXEC ran but its reply was lost", needs a proxy
// that knows where an EXEC is in the stream.
package faultproxy

import (
	"bytes"
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

	nConns, resets, execCuts, kills atomic.Int64
	wg                              sync.WaitGroup
}

type link struct {
	client, server net.Conn
	once           sync.Once
	cut            atomic.Bool // an EXEC went through; drop what comes back
}

func (l *link) close() {
	l.once.Do(func() {
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

// Set replaces the fault rates.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

func (p *Proxy) current() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// Counts returns what the proxy did so far.
func (p *Proxy) Counts() Counts {
	return Counts{Conns: p.nConns.Load(), Resets: p.resets.Load(), ExecCuts: p.execCuts.Load(), Kills: p.kills.Load()}
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
		l := &link{client: c, server: s}
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
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			f := p.current()
			if f.Latency > 0 {
				time.Sleep(f.Latency)
			}
			if !upstream && l.cut.Load() {
				p.execCuts.Add(1)
				return // the server answered; the client never hears it
			}
			if f.ResetProb > 0 && rand.Float64() < f.ResetProb {
				p.resets.Add(1)
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
			if upstream && f.ExecCutProb > 0 && bytes.Contains(bytes.ToLower(buf[:n]), execCmd) && rand.Float64() < f.ExecCutProb {
				l.cut.Store(true)
			}
		}
		if err != nil {
			return // EOF or a reset: the link closes both ways
		}
	}
}
