package localcluster

import (
	"os"
	"os/exec"
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
		{"old lines from line 0", "--- a/x\n+++ b/x\n@@ -0,1 +1 @@\n-a\n+b\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parsePatch([]byte(tt.patch)); err == nil {
				t.Errorf("parsePatch(%q) = nil error, want one", tt.patch)
			}
		})
	}
}

// TestForkPatchesApplyToPristineKubernetes applies each fork's patches to the k8s.io/kubernetes
// module its build module requires, as the fork's build does.
func TestForkPatchesApplyToPristineKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the k8s.io/kubernetes module (go mod download)")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, release := range forkReleases(t, root) {
		t.Run(release, func(t *testing.T) {
			modDir := forkDir(root, release)
			dir, err := kubernetesModuleDir(t.Context(), modDir)
			if err != nil {
				t.Fatal(err)
			}
			if want := "@" + release; !strings.HasSuffix(dir, want) {
				t.Errorf("forks/%s requires k8s.io/kubernetes at %s, want %s", release, dir, release)
			}
			work := t.TempDir()
			link := filepath.Join(work, "kubernetes")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			replace, err := forkOverlay(modDir, release, dir, link, filepath.Join(work, "patched"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{
				"pkg/registry/core/rest/storage_core.go",
				"pkg/registry/core/service/storage/alloc.go",
				"pkg/registry/core/rest/clusterip.go",         // forks/common
				"pkg/registry/core/rest/clusterip_release.go", // forks/<release>
			} {
				if _, ok := replace[filepath.Join(link, filepath.FromSlash(f))]; !ok {
					t.Errorf("overlay has no replacement of %s; it has %v", f, replace)
				}
			}
		})
	}
}

// forkReleases returns the releases with a fork folder under root, failing t if there is none.
func forkReleases(t *testing.T, root string) []string {
	t.Helper()
	var rels []string
	for _, r := range KubeAPIServerReleases() {
		if _, err := os.Stat(filepath.Join(forkDir(root, r), "go.mod")); err == nil {
			rels = append(rels, r)
		}
	}
	if len(rels) == 0 {
		t.Fatalf("no fork under %s", filepath.Join(root, forksDir))
	}
	return rels
}

// TestPatchZeroContextHunks applies hunks without context lines, as "diff -U0" writes them. A
// hunk whose old side is empty ("-l,0") inserts after old line l (l = 0: before the first
// line); any other hunk starts at old line l. The wants are what "git apply --unidiff-zero"
// and "patch" produce for the same patch.
func TestPatchZeroContextHunks(t *testing.T) {
	const src = "one\ntwo\nthree\nfour\nfive\n"
	tests := []struct {
		name, hunks, want string
	}{
		{"insert at start", "@@ -0,0 +1 @@\n+zero\n", "zero\none\ntwo\nthree\nfour\nfive\n"},
		{"insert two at start", "@@ -0,0 +1,2 @@\n+a\n+b\n", "a\nb\none\ntwo\nthree\nfour\nfive\n"},
		{"insert after line 1", "@@ -1,0 +2 @@\n+one and a half\n", "one\none and a half\ntwo\nthree\nfour\nfive\n"},
		{"insert in the middle", "@@ -2,0 +3 @@\n+two and a half\n", "one\ntwo\ntwo and a half\nthree\nfour\nfive\n"},
		{"insert at end", "@@ -5,0 +6,2 @@\n+six\n+seven\n", "one\ntwo\nthree\nfour\nfive\nsix\nseven\n"},
		{"delete first", "@@ -1 +0,0 @@\n-one\n", "two\nthree\nfour\nfive\n"},
		{"delete middle", "@@ -3 +2,0 @@\n-three\n", "one\ntwo\nfour\nfive\n"},
		{"delete last two", "@@ -4,2 +3,0 @@\n-four\n-five\n", "one\ntwo\nthree\n"},
		{"replace one", "@@ -3 +3 @@\n-three\n+THREE\n", "one\ntwo\nTHREE\nfour\nfive\n"},
		{"mixed", "@@ -0,0 +1 @@\n+zero\n@@ -2 +2,0 @@\n-two\n@@ -3,0 +3 @@\n+three and a half\n@@ -5 +5,2 @@\n-five\n+FIVE\n+six\n",
			"zero\none\nthree\nthree and a half\nfour\nFIVE\nsix\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parsePatch([]byte("--- a/f\n+++ b/f\n" + tt.hunks))
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.apply([]byte(src))
			if err != nil {
				t.Fatalf("apply() error = %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("apply() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestPatchZeroContextMatchesGitApply writes "diff -U0" patches between pairs of files and
// checks that apply gives the new file, as "git apply --unidiff-zero" does on a scratch copy.
func TestPatchZeroContextMatchesGitApply(t *testing.T) {
	diffPath, err := exec.LookPath("diff")
	if err != nil {
		t.Skip("no diff(1)")
	}
	gitPath, _ := exec.LookPath("git")
	lines := func(s ...string) string { return strings.Join(s, "\n") + "\n" }
	base := lines("a", "b", "c", "d", "e", "f", "g", "h")
	tests := []struct{ name, old, new string }{
		{"insert at start", base, lines("0", "a", "b", "c", "d", "e", "f", "g", "h")},
		{"insert in the middle", base, lines("a", "b", "c", "c2", "c3", "d", "e", "f", "g", "h")},
		{"insert at end", base, lines("a", "b", "c", "d", "e", "f", "g", "h", "i")},
		{"delete first", base, lines("b", "c", "d", "e", "f", "g", "h")},
		{"delete middle", base, lines("a", "b", "c", "f", "g", "h")},
		{"delete last", base, lines("a", "b", "c", "d", "e", "f", "g")},
		{"mixed", base, lines("x", "a", "c", "D", "d2", "e", "g", "h", "i", "j")},
		{"into empty", "", lines("a", "b")},
		{"to empty", base, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range map[string]string{"old": tt.old, "new": tt.new} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(diffPath, "-U0", "--label", "a/f", "--label", "b/f", "old", "new")
			cmd.Dir = dir
			patch, err := cmd.Output()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("diff -U0: exit %d, %v", code, err)
			}
			p, err := parsePatch(patch)
			if err != nil {
				t.Fatalf("parsePatch(%q) error = %v", patch, err)
			}
			got, err := p.apply([]byte(tt.old))
			if err != nil {
				t.Fatalf("apply(%q) error = %v", patch, err)
			}
			if string(got) != tt.new {
				t.Errorf("apply(%q) = %q, want %q", patch, got, tt.new)
			}
			if gitPath == "" {
				return
			}
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte(tt.old), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "p"), patch, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd = exec.Command(gitPath, "apply", "--unidiff-zero", "p")
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("git apply --unidiff-zero: %v\n%s", err, out)
			}
			gitGot, err := os.ReadFile(filepath.Join(dir, "f"))
			if err != nil {
				t.Fatal(err)
			}
			if string(gitGot) != string(got) {
				t.Errorf("git apply gives %q, apply gives %q", gitGot, got)
			}
		})
	}
}
