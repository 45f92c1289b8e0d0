package localcluster

import "syscall"

// childProcAttr makes the kernel kill the child if the test process dies
// before it can stop it, so no kube-apiserver outlives a crashed test.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
