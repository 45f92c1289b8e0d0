package localcluster

import (
	"context"
	"errors"
	"fmt"
	"go/version"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestKubeAPIServerBinaryFromEnv(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kube-apiserver")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KubeAPIServerEnv, bin)
	got, err := KubeAPIServerBinary(context.Background())
	if err != nil || got != bin {
		t.Errorf("KubeAPIServerBinary() = %q, %v, want %q, nil", got, err, bin)
	}

	t.Setenv(KubeAPIServerEnv, bin+".missing")
	if got, err := KubeAPIServerBinary(context.Background()); err == nil {
		t.Errorf("KubeAPIServerBinary() with a missing $%s = %q, want an error", KubeAPIServerEnv, got)
	}
}

func TestKubeAPIServerReleaseBinaryFromEnv(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kube-apiserver")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, env, release string
		want               string // "" for an error
	}{
		{"the release's own variable", "CLUSTERIP_KUBE_APISERVER_V1_37", "v1.37.2", bin},
		{"a missing file", "CLUSTERIP_KUBE_APISERVER_V1_36", "v1.36.3", ""},
		{"the default release's variable", "CLUSTERIP_KUBE_APISERVER_V1_33", "v1.33.13", bin},
		{"the historic variable for the default release", KubeAPIServerEnv, "", bin},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range KubeAPIServerReleases() {
				t.Setenv(KubeAPIServerReleaseEnv(r), "")
			}
			t.Setenv(KubeAPIServerEnv, "")
			val := bin
			if tt.want == "" {
				val = bin + ".missing"
			}
			t.Setenv(tt.env, val)
			got, err := KubeAPIServerReleaseBinary(context.Background(), tt.release)
			if tt.want == "" {
				if err == nil || !strings.Contains(err.Error(), tt.env) {
					t.Errorf("KubeAPIServerReleaseBinary(%q) with a missing $%s = %q, %v, want an error naming it", tt.release, tt.env, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("KubeAPIServerReleaseBinary(%q) with $%s = %q, %v, want %q, nil", tt.release, tt.env, got, err, tt.want)
			}
		})
	}
}

func TestKubeAPIServerReleaseEnvIsPerMinor(t *testing.T) {
	for _, tt := range []struct{ release, want string }{
		{"v1.33.13", "CLUSTERIP_KUBE_APISERVER_V1_33"},
		{"v1.37.2", "CLUSTERIP_KUBE_APISERVER_V1_37"},
		{"v1.38.0-beta.0", "CLUSTERIP_KUBE_APISERVER_V1_38"},
		{"v1.38.0", "CLUSTERIP_KUBE_APISERVER_V1_38"},
	} {
		if got := KubeAPIServerReleaseEnv(tt.release); got != tt.want {
			t.Errorf("KubeAPIServerReleaseEnv(%q) = %q, want %q", tt.release, got, tt.want)
		}
	}
}

func TestKubeAPIServerReleaseBinaryRefusesUnsupportedRelease(t *testing.T) {
	// v1.34 is served by the module proxy but past its end of life and not built.
	got, err := KubeAPIServerReleaseBinary(context.Background(), "v1.34.4")
	if err == nil || !strings.Contains(err.Error(), "not a supported release") || !strings.Contains(err.Error(), "v1.37.2") {
		t.Errorf("KubeAPIServerReleaseBinary(v1.34.4) = %q, %v, want an error naming the supported releases", got, err)
	}
}

// TestEachReleaseHasItsPinnedModule checks that each release's nested module requires
// k8s.io/kubernetes at that release, replaces the staging modules by the same release's, and has
// its go.sum: the build runs offline from what the repository pins.
func TestEachReleaseHasItsPinnedModule(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range KubeAPIServerReleases() {
		t.Run(r, func(t *testing.T) {
			dir := stockModuleDir(root, r)
			mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err != nil {
				t.Fatal(err)
			}
			staging := "v0" + strings.TrimPrefix(r, "v1")
			for _, want := range []string{
				"module github.com/kube-ipam/clusterip/internal/kubeapiserver/" + r + "\n",
				"\tk8s.io/kubernetes " + r + " ",
				"\tk8s.io/apiserver => k8s.io/apiserver " + staging + "\n",
				"\tk8s.io/component-base => k8s.io/component-base " + staging + "\n",
			} {
				if !strings.Contains(string(mod), want) {
					t.Errorf("%s/go.mod has no line %q", dir, strings.TrimSpace(want))
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "go.sum")); err != nil {
				t.Error(err)
			}
			checkToolchain(t, filepath.Join(dir, "go.mod"), string(mod))
			if isModuleRoot(dir) {
				t.Errorf("isModuleRoot(%s) = true, want false", dir)
			}
		})
	}
}

// checkToolchain fails t if the go.mod file at path, whose text is mod, has a go line newer than
// the Go running the tests and no toolchain line that the build could run instead (see
// nestedGoEnv), or a toolchain line older than its go line.
func checkToolchain(t *testing.T, path, mod string) {
	t.Helper()
	var goLine string
	for line := range strings.Lines(mod) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goLine = "go" + strings.TrimSpace(rest)
		}
	}
	tc, err := moduleToolchain(path)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case tc == "" && version.Compare(goLine, runtime.Version()) > 0:
		t.Errorf("%s says %s, newer than %s, and has no toolchain line for the build to run", path, goLine, runtime.Version())
	case tc != "" && version.Compare(tc, goLine) < 0:
		t.Errorf("%s: toolchain %s is older than its %s", path, tc, goLine)
	}
}

// TestNestedGoEnvRunsTheModuleToolchain checks that a go command run in a nested module whose
// go.mod names a toolchain runs that toolchain, whatever GOTOOLCHAIN the process has, and that
// one without a toolchain line keeps the process's own.
func TestNestedGoEnvRunsTheModuleToolchain(t *testing.T) {
	for _, tt := range []struct {
		name, mod, want string // want: the last GOTOOLCHAIN of the environment, "" for none added
	}{
		{"no toolchain line", "module m\n\ngo 1.26.0\n", ""},
		{"a toolchain line", "module m\n\ngo 1.27.0\n\ntoolchain go1.27.3\n\ngodebug default=go1.27\n", "go1.27.3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOTOOLCHAIN", "local")
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(tt.mod), 0o644); err != nil {
				t.Fatal(err)
			}
			env, err := NestedGoEnv(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"GOWORK=off", "GOFLAGS="} {
				if !slices.Contains(env, want) {
					t.Errorf("NestedGoEnv has no %s", want)
				}
			}
			want := "GOTOOLCHAIN=local"
			if tt.want != "" {
				want = "GOTOOLCHAIN=" + tt.want
			}
			var got string
			for _, kv := range env {
				if strings.HasPrefix(kv, "GOTOOLCHAIN=") {
					got = kv // the last one wins
				}
			}
			if got != want {
				t.Errorf("NestedGoEnv's last GOTOOLCHAIN = %q, want %q", got, want)
			}
		})
	}
	if _, err := NestedGoEnv(t.TempDir()); err == nil {
		t.Error("NestedGoEnv of a directory without go.mod = nil error, want one")
	}
}

func TestRepoRootFindsLibraryModule(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(stockModuleDir(root, KubeAPIServerVersion), "go.mod")); err != nil {
		t.Errorf("repoRoot() = %s, which has no nested module for kube-apiserver %s: %v", root, KubeAPIServerVersion, err)
	}
}

// messages collects what cachedBuild says.
type messages struct {
	mu    sync.Mutex
	lines []string
}

func (m *messages) say(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lines = append(m.lines, fmt.Sprintf(format, args...))
}

// count returns how many lines start with prefix.
func (m *messages) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, l := range m.lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// writeBinary is a build function that writes a fake binary and counts its calls.
func writeBinary(calls *atomic.Int32) func(context.Context, string) error {
	return func(_ context.Context, out string) error {
		calls.Add(1)
		return os.WriteFile(out, []byte("kube-apiserver"), 0o755)
	}
}

func TestCachedBuildBuildsOnceForConcurrentCallers(t *testing.T) {
	cache := t.TempDir()
	var calls atomic.Int32
	started := make(chan struct{})
	build := func(ctx context.Context, out string) error {
		close(started)
		time.Sleep(700 * time.Millisecond) // long enough for the others to find the lock taken
		return writeBinary(&calls)(ctx, out)
	}
	var msgs messages
	var wg sync.WaitGroup
	paths := make([]string, 4)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i > 0 {
				<-started
			}
			p, err := cachedBuild(context.Background(), cache, build, msgs.say)
			if err != nil {
				t.Errorf("cachedBuild() = %v", err)
			}
			paths[i] = p
		}()
	}
	wg.Wait()
	if got := calls.Load(); got != 1 {
		t.Errorf("build ran %d times for 4 concurrent callers, want 1", got)
	}
	// The build says once what it does and how long it takes; each caller that waits says why.
	for _, tt := range []struct {
		prefix string
		want   int
	}{
		{"building kube-apiserver " + KubeAPIServerVersion + " from source for the integration tests (about 7 minutes", 1},
		{"built kube-apiserver", 1},
		{"waiting for another process that is building kube-apiserver", 3},
	} {
		if got := msgs.count(tt.prefix); got != tt.want {
			t.Errorf("%d messages starting %q, want %d; all:\n%s", got, tt.prefix, tt.want, strings.Join(msgs.lines, "\n"))
		}
	}
	want := filepath.Join(cache, "kube-apiserver-"+KubeAPIServerVersion, "kube-apiserver")
	for i, p := range paths {
		if p != want {
			t.Errorf("cachedBuild() #%d = %q, want %q", i, p, want)
		}
	}
	if b, err := os.ReadFile(want); err != nil || string(b) != "kube-apiserver" {
		t.Errorf("cached binary = %q, %v, want what build wrote", b, err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(cache, "*", "kube-apiserver-build-*")); len(leftovers) != 0 {
		t.Errorf("temporary build outputs left behind: %v", leftovers)
	}
}

func TestCachedBuildDoesNotRetryAFailureOfThisRun(t *testing.T) {
	cache := t.TempDir()
	var calls atomic.Int32
	failing := func(context.Context, string) error {
		calls.Add(1)
		return errors.New("out of memory")
	}
	if _, err := cachedBuild(context.Background(), cache, failing, t.Logf); err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("cachedBuild() with a failing build = %v, want its error", err)
	}
	// A second caller in this run gets the same failure without a second build of several minutes.
	_, err := cachedBuild(context.Background(), cache, failing, t.Logf)
	if err == nil || !strings.Contains(err.Error(), "out of memory") || !strings.Contains(err.Error(), "failed earlier in this run") {
		t.Errorf("cachedBuild() after a failed build = %v, want the earlier failure", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("build ran %d times, want 1", got)
	}

	// A failure recorded before this process started (an earlier run) is tried again, and a success
	// clears the record.
	failed := filepath.Join(cache, "kube-apiserver-"+KubeAPIServerVersion, "build-failed.log")
	old := processStart.Add(-time.Hour)
	if err := os.Chtimes(failed, old, old); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	if _, err := cachedBuild(context.Background(), cache, writeBinary(&ok), t.Logf); err != nil {
		t.Fatalf("cachedBuild() after an earlier run's failure = %v, want a new build", err)
	}
	if ok.Load() != 1 {
		t.Errorf("build ran %d times after an earlier run's failure, want 1", ok.Load())
	}
	if _, err := os.Stat(failed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failure record after a successful build: Stat() = %v, want it removed", err)
	}
}

func TestCachedBuildRemovesOutputsOfKilledBuilds(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, "kube-apiserver-"+KubeAPIServerVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "kube-apiserver-build-123")
	if err := os.WriteFile(stale, []byte("half a binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	if _, err := cachedBuild(context.Background(), cache, writeBinary(&calls), t.Logf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale build output: Stat() = %v, want it removed", err)
	}
}

func TestLockFileIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	waits := 0
	if unlock2, err := lockFile(ctx, path, func() { waits++ }); err == nil {
		unlock2()
		t.Fatalf("lockFile() of a held lock succeeded, want it to wait until ctx is done")
	}
	if waits != 1 {
		t.Errorf("lockFile() of a held lock called onWait %d times, want once", waits)
	}
	unlock()
	waits = 0
	unlock3, err := lockFile(context.Background(), path, func() { waits++ })
	if err != nil {
		t.Fatalf("lockFile() after unlock: %v", err)
	}
	unlock3()
	if waits != 0 {
		t.Errorf("lockFile() of a free lock called onWait %d times, want 0", waits)
	}
}

func TestCachedKubeAPIServerBinaryNeverBuilds(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kube-apiserver")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KubeAPIServerEnv, bin)
	if got, err := CachedKubeAPIServerBinary(); err != nil || got != bin {
		t.Errorf("CachedKubeAPIServerBinary() with $%s = %q: %q, %v, want %q, nil", KubeAPIServerEnv, bin, got, err, bin)
	}

	t.Setenv(KubeAPIServerEnv, bin+".missing")
	if got, err := CachedKubeAPIServerBinary(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CachedKubeAPIServerBinary() with a missing $%s = %q, %v, want an error matching os.ErrNotExist", KubeAPIServerEnv, got, err)
	}

	// Without the variable it looks at the cache only: it returns the cached build if this clone
	// has one, and otherwise an error naming the path, without building it.
	t.Setenv(KubeAPIServerEnv, "")
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	want := cachedBinary(filepath.Join(root, ".cache"))
	_, statErr := os.Stat(want)
	got, err := CachedKubeAPIServerBinary()
	if statErr == nil {
		if err != nil || got != want {
			t.Errorf("CachedKubeAPIServerBinary() = %q, %v, want the cached %q, nil", got, err, want)
		}
		return
	}
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("CachedKubeAPIServerBinary() without a cached build = %q, %v, want an error matching os.ErrNotExist that names %s", got, err, want)
	}
	if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after CachedKubeAPIServerBinary(), %s: %v, want it still missing (never built)", want, err)
	}
}
