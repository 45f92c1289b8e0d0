package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/kube-ipam/clusterip"

// slimTags are the build tags of the slim build, the container image's binary (hack/image.sh and
// the Dockerfile build with the same): clusterip_slim leaves out demo and bench, and grpcnotrace
// leaves out grpc's request tracing (golang.org/x/net/trace), whose html/template would turn off
// the linker's dead-code elimination of methods.
const slimTags = "clusterip_slim,grpcnotrace"

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
		{"slim", slimTags, false},
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

// TestSlimBuildDropsUnusedMethods keeps the slim build small: the linker drops an exported method
// no code calls only while nothing reachable looks methods up by a name it computes
// (reflect.Value.MethodByName with a variable, as text/template's field evaluation and go-cmp's
// type names do). One such path (cobra's usage templates before v1.10.2 reached through it,
// grpc's tracing pages, google.golang.org/protobuf before v1.36.12) keeps every exported method
// of every linked type, about 20 MB more. The test builds the slim binary as the image does and
// looks for a method the command never calls (the clientset's AppsV1) beside one it calls
// (CoreV1).
func TestSlimBuildDropsUnusedMethods(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the slim binary with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "clusterip")
	build := exec.Command(goTool, "build", "-trimpath", "-tags", slimTags, "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the slim command: %v\n%s", err, out)
	}
	out, err := exec.Command(goTool, "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm %s: %v", bin, err)
	}
	symbols := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[1] == "T" {
			symbols[f[2]] = true
		}
	}
	tests := []struct {
		symbol string
		want   bool
	}{
		{"k8s.io/client-go/kubernetes.(*Clientset).CoreV1", true},
		{"k8s.io/client-go/kubernetes.(*Clientset).AppsV1", false},
		{"text/template.(*state).evalField", false},
		{"golang.org/x/net/trace.New", false},
	}
	for _, tt := range tests {
		if got := symbols[tt.symbol]; got != tt.want {
			t.Errorf("the slim binary has %s: %v, want %v", tt.symbol, got, tt.want)
		}
	}
	if fi, err := os.Stat(bin); err == nil {
		t.Logf("slim binary (not stripped): %d bytes", fi.Size())
	}
}
