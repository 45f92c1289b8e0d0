package linearizability

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer accepts connections on 127.0.0.1 and writes back every line it reads, until t ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					c.Write(append(sc.Bytes(), '\n'))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends line on c and returns what comes back within d, or "" and false.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, bool) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(d))
	got, err := r.ReadString('\n')
	if err != nil {
		return "", false
	}
	return got[:len(got)-1], true
}

func TestProxyBlackholesAndHeals(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, ok := roundTrip(t, c, r, "one", 5*time.Second); !ok || got != "one" {
		t.Fatalf("before the blackhole: got %q, %v; want one", got, ok)
	}
	p.Blackhole()
	if got, ok := roundTrip(t, c, r, "two", 200*time.Millisecond); ok {
		t.Fatalf("through the blackhole: got %q, want nothing", got)
	}
	p.Heal()
	// What was held back arrives once healed.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after healing: got %q, %v; want the held-back two", got, err)
	}
	// A new target takes new connections; Cut closes the old ones.
	p.SetTarget(echoServer(t))
	p.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatalf("a cut connection still reads")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, ok := roundTrip(t, c2, bufio.NewReader(c2), "three", 5*time.Second); !ok || got != "three" {
		t.Fatalf("to the new target: got %q, %v; want three", got, ok)
	}
}
