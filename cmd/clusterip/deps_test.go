package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/kube-ipam/clusterip"

// goList runs "go list" with args in this package's directory and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the binary's packages with: %v", err)
	}
	out, err := exec.Command(goTool, append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// TestBinaryLinksNoTestCode keeps the test harness out of the shipped binary: nothing the command
// links may import package testing (the etcd and kube-apiserver it starts come from
// internal/localcluster, not internal/testenv).
func TestBinaryLinksNoTestCode(t *testing.T) {
	deps := goList(t, "-deps", "-f", "{{.ImportPath}}", ".")
	if len(deps) == 0 {
		t.Fatal("go list -deps listed no packages")
	}
	for _, p := range deps {
		if p == "testing" || strings.HasPrefix(p, "testing/") || strings.HasPrefix(p, modulePath+"/internal/testenv") {
			t.Errorf("the clusterip command links %s; its packages and their dependencies must not import the test harness", p)
		}
	}
}

// TestCommandUsesPublicAPIOnly checks what the command's own packages import from the library:
// its public packages, internal/localcluster (the local etcd and kube-apiserver) and the etcd
// server it runs in process (internal/localcluster/etcdserver/embedded), and
// internal/forkbench (the rows file of the stock-vs-fork benchmark, which the fork module's test
// writes), never the library's internal machinery, so that the command shows what a user of the
// library can do.
func TestCommandUsesPublicAPIOnly(t *testing.T) {
	lines := goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{$.ImportPath}}>{{.}}{{end}}`, "./...")
	checked := 0
	for _, l := range lines {
		from, imp, ok := strings.Cut(l, ">")
		if !ok || !strings.HasPrefix(imp, modulePath+"/") {
			continue
		}
		checked++
		switch {
		case imp == modulePath+"/internal/localcluster", imp == modulePath+"/internal/forkbench",
			imp == modulePath+"/internal/localcluster/etcdserver/embedded":
		case strings.HasPrefix(imp, modulePath+"/cmd/clusterip/"):
		case strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal"):
			t.Errorf("%s imports %s, an internal package of the library; use its public API", from, imp)
		}
	}
	if checked == 0 {
		t.Fatal("found no import of the library to check")
	}
}

// TestSlimBuildLinksNoEtcdServerNorPlotting keeps the slim build (-tags clusterip_slim, the
// container image's binary) free of what only demo and bench need: the etcd server they run in
// process and gonum's plotting. The full build must link both, so that the test sees the paths
// it looks for where they are; and both must link the webhook the image runs.
func TestSlimBuildLinksNoEtcdServerNorPlotting(t *testing.T) {
	forbidden := []string{
		"go.etcd.io/etcd/server/",
		"go.etcd.io/etcd/raft/",
		"go.etcd.io/bbolt",
		modulePath + "/internal/localcluster/etcdserver",
		"gonum.org/",
	}
	tests := []struct {
		name      string
		tags      string
		wantLinks bool // whether the build links each of forbidden
	}{
		{"full", "", true},
		{"slim", "clusterip_slim", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deps := goList(t, "-tags", tt.tags, "-deps", "-f", "{{.ImportPath}}", ".")
			if !slices.Contains(deps, modulePath+"/reservation/webhook") {
				t.Fatalf("the %s build does not link %s/reservation/webhook; go list -deps listed %d packages", tt.name, modulePath, len(deps))
			}
			for _, f := range forbidden {
				var linked []string
				for _, p := range deps {
					if strings.HasPrefix(p, f) || p == strings.TrimSuffix(f, "/") {
						linked = append(linked, p)
					}
				}
				if got := len(linked) > 0; got != tt.wantLinks {
					t.Errorf("the %s build links %s: %v, want %v (packages: %v)", tt.name, f, got, tt.wantLinks, linked)
				}
			}
		})
	}
}
