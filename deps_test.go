package clusterip_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goListDeps returns the import paths of the packages pkg links, as "go list -deps" lists them
// from the module root.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the packages with: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestIPAddressOnlyLinksNoEtcd keeps the etcd client (and with it grpc and zap) out of a program
// that builds IPAddressOnly allocators with New and runs package repair, as the
// examples/ipaddressonly registry does: that mode keeps no bitmap, so only a program that imports
// bitmap/etcdstore, for Legacy or DualWrite mode, may link go.etcd.io.
func TestIPAddressOnlyLinksNoEtcd(t *testing.T) {
	const module = "github.com/kube-ipam/clusterip"
	deps := goListDeps(t, "./examples/ipaddressonly")
	for _, want := range []string{module, module + "/repair"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps ./examples/ipaddressonly does not list %s: the example no longer shows what this test is about", want)
		}
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "go.etcd.io/") {
			t.Errorf("an IPAddressOnly program links %s; only bitmap/etcdstore may import the etcd client", p)
		}
	}
	// The same check finds etcd where it must be, so that it can fail.
	if !slices.ContainsFunc(goListDeps(t, "./bitmap/etcdstore"), func(p string) bool { return strings.HasPrefix(p, "go.etcd.io/") }) {
		t.Error("go list -deps ./bitmap/etcdstore lists no go.etcd.io package; the check above looks for the wrong thing")
	}
}
