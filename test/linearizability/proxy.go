package linearizability

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections from a loopback port to a target, and can blackhole them: while
// it does, nothing is forwarded either way, on connections old or new, as when the network
// between the two drops every packet; once healed, what was held back is delivered, as TCP's
// retransmissions would. The target can be changed, for a server restarted on another port. No
// real network is touched.
//
// The zero Proxy is not usable; use [NewProxy]. A Proxy is safe for concurrent use.
type Proxy struct {
	ln net.Listener

	mu      sync.Mutex // guards target, holed, healed, conns, closed
	target  string
	holed   bool
	healed  chan struct{} // closed when the blackhole ends; replaced when one starts
	conns   map[net.Conn]bool
	closed  bool
	handled sync.WaitGroup
}

// NewProxy listens on a free 127.0.0.1 port and forwards every connection to target
// ("host:port").
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, healed: make(chan struct{}), conns: map[net.Conn]bool{}}
	close(p.healed)
	p.handled.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the "127.0.0.1:port" the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget makes new connections go to target; connections already made keep theirs.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Blackhole stops forwarding until [Proxy.Heal].
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holed {
		p.holed = true
		p.healed = make(chan struct{})
	}
}

// Heal forwards again what was held back and what comes next.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holed {
		p.holed = false
		close(p.healed)
	}
}

// Cut closes every connection made so far, as a peer that restarted would; new ones are made as
// usual.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.holed {
		p.holed = false
		close(p.healed)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.handled.Wait()
	return err
}

// gate waits until the proxy is not blackholed and returns true, or returns false once the proxy
// is closed.
func (p *Proxy) gate() bool {
	p.mu.Lock()
	healed, closed := p.healed, p.closed
	p.mu.Unlock()
	<-healed
	p.mu.Lock()
	defer p.mu.Unlock()
	return !closed && !p.closed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) serve() {
	defer p.handled.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.handled.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	defer p.handled.Done()
	defer p.untrack(c)
	defer c.Close()
	if !p.gate() {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	t, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	if !p.track(t) {
		t.Close()
		return
	}
	defer p.untrack(t)
	defer t.Close()
	done := make(chan struct{}, 2)
	go func() { p.pipe(t, c); done <- struct{}{} }()
	go func() { p.pipe(c, t); done <- struct{}{} }()
	<-done
	c.Close()
	t.Close()
	<-done
}

// pipe copies from src to dst, holding each read back while the proxy is blackholed.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}
