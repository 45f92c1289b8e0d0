package kubeapiserverfork_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of the CPU times in /proc/<pid>/stat: 100 on every
// architecture Go supports.
const clockTicks = 100

// selfCPU returns the user and system CPU time this process (the test's clients) has used so
// far.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// processCPU returns a function reporting the user and system CPU time used so far by the
// process of the program named program whose command line names dir: a kube-apiserver's
// KubeAPIServer.Dir (its certificates and token file), or an etcd's Dir (its data).
func processCPU(program, dir string) (func() (time.Duration, error), error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmd, []byte(dir)) || !bytes.Contains(cmd, []byte(program)) {
			continue
		}
		return func() (time.Duration, error) { return procCPU(pid) }, nil
	}
	return nil, fmt.Errorf("no %s process with %s on its command line", program, dir)
}

// procCPU returns utime+stime of process pid, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	// Fields after "(comm)": state is field 3, utime 14 and stime 15 (proc(5)).
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}
