//go:build !linux

package localcluster

import "syscall"

// childProcAttr returns nil: only Linux can kill the child when the parent
// dies.
func childProcAttr() *syscall.SysProcAttr { return nil }
