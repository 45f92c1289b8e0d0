package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A killed etcd process, as by a crash or the kernel's OOM killer, loses nothing that was
// committed: Restart starts a new one on the same data directory.
func TestEtcdRestartsAfterSIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := StartEtcd(ctx, EtcdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put() error = %v", err)
	}
	e.mu.Lock()
	p := e.proc.(*etcdProcess)
	e.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	if e.Running() {
		t.Errorf("Running() after SIGKILL = true, want false")
	}
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart() after SIGKILL error = %v", err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get() after Restart error = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get(/k) after Restart = %v, want one value %q", resp.Kvs, "v")
	}
}

func TestEtcdBinaryFromEnv(t *testing.T) {
	t.Setenv(EtcdEnv, t.TempDir()+"/missing")
	if got, err := EtcdBinary(context.Background()); err == nil {
		t.Errorf("EtcdBinary() with a missing $%s = %q, want an error", EtcdEnv, got)
	}
}

// etcdParentEnv, when set, makes TestEtcdDiesWithItsParent the parent: it starts an etcd,
// prints the etcd's process ID and waits to be killed.
const etcdParentEnv = "LOCALCLUSTER_TEST_ETCD_PARENT"

// A test process that is killed, as by go test's -timeout or a crash, leaves no etcd behind: the
// kernel kills the child (Pdeathsig).
func TestEtcdDiesWithItsParent(t *testing.T) {
	if os.Getenv(etcdParentEnv) != "" {
		e, err := StartEtcd(context.Background(), EtcdOptions{UnsafeNoFsync: true})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(e.proc.(*etcdProcess).cmd.Process.Pid)
		select {}
	}
	if runtime.GOOS != "linux" {
		t.Skip("only Linux kills a child when its parent dies")
	}
	if _, err := EtcdBinary(context.Background()); err != nil {
		t.Fatal(err)
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestEtcdDiesWithItsParent$", "-test.count=1", "-test.timeout=2m")
	parent.Env = append(os.Environ(), etcdParentEnv+"=1")
	stdout, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	parent.Stderr = &stderr
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("parent printed %q (%v, %v); stderr:\n%s", line, err, perr, stderr.Bytes())
	}
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	parent.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		// A zombie would still answer signal 0 until init reaps it; its status says so.
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(data), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("etcd (pid %d) still runs 10s after its parent was killed", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
