package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// Child is the test binary run again as a separate OS process, running one of its tests with a
// spec passed as JSON in an environment variable: the multi-process skew, fault and soak tests'
// allocator processes. By convention the child announces itself on stdout and waits until its
// stdin closes ([Child.Start]), so that a parent starts all its children at once.
type Child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{} // closed when stdout has closed
	other  bytes.Buffer  // stdout lines onLine did not take; written until done closes
	stderr bytes.Buffer  // written by exec until the process has exited
}

// StartChild starts os.Args[0] with -test.run selecting test alone and env set to spec as JSON.
// Each line the child writes on stdout goes to onLine, from one goroutine, until stdout closes;
// the lines it does not take (it returns false) are kept for [Child.Output]. The child is killed
// when t ends, if it still runs. name names it in failures.
func StartChild(t testing.TB, name, test, env string, spec any, onLine func(line string) (taken bool)) *Child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{name: name, done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.timeout=10m")
	c.cmd.Env = append(os.Environ(), env+"="+string(raw))
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if !onLine(sc.Text()) {
				c.other.WriteString(sc.Text() + "\n")
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		_ = c.cmd.Wait()
	})
	return c
}

// Start closes the child's stdin: its signal to begin.
func (c *Child) Start() { _ = c.stdin.Close() }

// Done is closed once the child's stdout has closed and onLine has seen its every line.
func (c *Child) Done() <-chan struct{} { return c.done }

// Kill sends SIGKILL and waits for the child to exit.
func (c *Child) Kill() error {
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-c.done
	_ = c.cmd.Wait()
	return nil
}

// Signal sends sig to the child, such as SIGSTOP and SIGCONT to pause it and let it go on.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Wait waits for the child to exit and returns its error, as exec.Cmd.Wait does.
func (c *Child) Wait() error {
	<-c.done
	return c.cmd.Wait()
}

// Output returns the end (at most 4000 bytes) of what the child wrote that onLine did not take,
// then its stderr. Call it only once the child has exited.
func (c *Child) Output() string {
	s := c.other.String() + c.stderr.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// ChildSpec reads the spec a parent passed in env into spec, and reports whether this process is
// such a child. A test that is a child's body skips unless it is: call it first.
func ChildSpec(t testing.TB, env string, spec any) bool {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		return false
	}
	if err := json.NewDecoder(strings.NewReader(raw)).Decode(spec); err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	return true
}
