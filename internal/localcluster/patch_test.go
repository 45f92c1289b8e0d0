package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const pristine = `package x

func a() int {
	return 1
}

func b() int {
	return 2
}
`

const goodPatch = `--- a/x/x.go
+++ b/x/x.go
@@ -1,5 +1,6 @@
 package x
 
+// a returns 1.
 func a() int {
 	return 1
 }
@@ -7,3 +8,3 @@
 func b() int {
-	return 2
+	return 3
 }
`

func TestPatchApplies(t *testing.T) {
	p, err := parsePatch([]byte(goodPatch))
	if err != nil {
		t.Fatal(err)
	}
	if p.path != "x/x.go" {
		t.Errorf("path = %q, want %q", p.path, "x/x.go")
	}
	got, err := p.apply([]byte(pristine))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(strings.Replace(pristine, "func a", "// a returns 1.\nfunc a", 1), "return 2", "return 3", 1)
	if string(got) != want {
		t.Errorf("apply:\n%s\nwant:\n%s", got, want)
	}
}

func TestPatchFailsLoudlyOnAnotherRelease(t *testing.T) {
	p, err := parsePatch([]byte(goodPatch))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, src, wantErr string
	}{
		{"changed line", strings.Replace(pristine, "return 2", "return 20", 1), `line 8 is "\treturn 20", the patch expects "\treturn 2"`},
		{"moved down a line", "// moved\n" + pristine, `line 1 is "// moved", the patch expects "package x"`},
		{"truncated", "package x\n", "line 2 is end of file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.apply([]byte(tt.src))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("apply() error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestParsePatchRejectsMalformed(t *testing.T) {
	tests := []struct{ name, patch string }{
		{"no file", "@@ -1,1 +1,1 @@\n-a\n+b\n"},
		{"no hunk", "--- a/x\n+++ b/x\n"},
		{"short hunk", "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n"},
		{"two files", goodPatch + "--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n"},
		{"bad header", "--- a/x\n+++ b/x\n@@ -x +1 @@\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parsePatch([]byte(tt.patch)); err == nil {
				t.Errorf("parsePatch(%q) = nil error, want one", tt.patch)
			}
		})
	}
}

// TestForkPatchesApplyToPristineKubernetes applies the fork module's patches to the
// k8s.io/kubernetes module it requires, as the fork's build does.
func TestForkPatchesApplyToPristineKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the k8s.io/kubernetes module (go mod download)")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	modDir := filepath.Join(root, filepath.FromSlash(forkModuleDir))
	dir, err := kubernetesModuleDir(t.Context(), modDir)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	link := filepath.Join(work, "kubernetes")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	replace, err := forkOverlay(modDir, dir, link, filepath.Join(work, "patched"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{
		"pkg/registry/core/rest/storage_core.go",
		"pkg/registry/core/service/storage/alloc.go",
		"pkg/registry/core/rest/clusterip.go",
	} {
		if _, ok := replace[filepath.Join(link, filepath.FromSlash(f))]; !ok {
			t.Errorf("overlay has no replacement of %s; it has %v", f, replace)
		}
	}
}
