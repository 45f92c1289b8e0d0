package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// Main runs the tests of a package that starts a kube-apiserver and returns the exit code for
// [os.Exit], closing every shared when they are done:
//
//	var shared testenv.Shared
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &shared)) }
//
// Before the tests run, Main makes sure the kube-apiserver binary exists, building it if needed
// (see [localcluster.KubeAPIServerBinary]): the test binary's -timeout starts with the first test, so a first
// build on a new machine, which takes minutes, counts neither against it nor against any test.
// It does not when -short is set (the kube-apiserver tests skip), nor when -run selects tests
// without -bench (a targeted run builds only if one of its tests asks, within -timeout).
// Likewise it makes sure the etcd server binary exists ([localcluster.EtcdBinary]), building it
// if needed, for every run but a -short one, targeted or not: that build takes a minute or two.
// If a build fails, the error goes to stderr and the tests still run: those that need the
// binary fail with the same error, without building again.
func Main(m *testing.M, shared ...*Shared) int {
	flag.Parse()
	// The etcd server takes a minute or two to build with an empty build cache, and
	// testenv.NewEtcd's start timeout covers the build, so it is built first for every run but a
	// -short one.
	if !testing.Short() {
		if _, err := localcluster.EtcdBinary(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if prebuild() {
		if _, err := localcluster.KubeAPIServerBinary(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	code := m.Run()
	for _, s := range shared {
		s.Close()
	}
	return code
}

// prebuild reports whether [Main] should make sure of the kube-apiserver binary before the tests.
func prebuild() bool {
	if testing.Short() {
		return false
	}
	return flagValue("test.run") == "" || flagValue("test.bench") != ""
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
