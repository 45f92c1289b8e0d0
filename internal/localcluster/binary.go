package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// KubeAPIServerVersion is the release of the kube-apiserver that
// [KubeAPIServerBinary] builds, the default of [KubeAPIServerReleaseBinary]
// and [KubeAPIServerOptions.Release]. It is v1.33 because v1.34 and later lock
// the MultiCIDRServiceAllocator feature gate on, and the interop tests need a
// peer that still runs the legacy bitmap allocator.
const KubeAPIServerVersion = "v1.33.13"

// KubeAPIServerV138 is the v1.38 release that [KubeAPIServerReleaseBinary] builds: its
// pre-release until v1.38.0 ships, when moving this one name (and renaming its nested module
// and fork folders, see docs/fork.md) makes the release a version bump.
const KubeAPIServerV138 = "v1.38.0-beta.0"

// kubeAPIServerReleases are the releases [KubeAPIServerReleaseBinary] builds,
// oldest first: one per supported minor, each from its nested module
// internal/kubeapiserver/<release>.
var kubeAPIServerReleases = []string{"v1.33.13", "v1.35.4", "v1.36.3", "v1.37.2", KubeAPIServerV138}

// KubeAPIServerReleases returns the kube-apiserver releases that
// [KubeAPIServerReleaseBinary] builds, oldest first; [KubeAPIServerVersion] is
// one of them. The caller may change the slice.
func KubeAPIServerReleases() []string { return slices.Clone(kubeAPIServerReleases) }

// KubeAPIServerEnv names the environment variable that, when set, gives the
// path of a kube-apiserver binary to use instead of the cached build of
// [KubeAPIServerVersion]. See [KubeAPIServerReleaseEnv] for the other releases.
const KubeAPIServerEnv = "CLUSTERIP_KUBE_APISERVER"

// KubeAPIServerReleaseEnv returns the name of the environment variable that,
// when set, gives the path of a kube-apiserver binary to use instead of the
// cached build of release: CLUSTERIP_KUBE_APISERVER_V1_37 for "v1.37.2", one per
// minor, pre-releases included (CLUSTERIP_KUBE_APISERVER_V1_38 for "v1.38.0-beta.0"). For
// [KubeAPIServerVersion], [KubeAPIServerEnv] comes first.
func KubeAPIServerReleaseEnv(release string) string {
	minor, _, _ := strings.Cut(strings.TrimPrefix(release, "v"), "-")
	if i := strings.LastIndexByte(minor, '.'); i > 0 && strings.Count(minor, ".") == 2 {
		minor = minor[:i]
	}
	return KubeAPIServerEnv + "_V" + strings.ReplaceAll(minor, ".", "_")
}

// modulePath is the path of the library's module, whose go.mod marks the
// repository root.
const modulePath = "github.com/kube-ipam/clusterip"

// processStart is when this process started, as far as the build's failure
// record is concerned.
var processStart = time.Now()

// buildEstimate is what the first build tells the user to expect: measured on
// an idle 2-core machine with an empty Go build cache; on one shared with
// other builds and tests (load 15-23) the same build took 44 minutes.
const buildEstimate = "about 7 minutes and 2 GiB of RAM on 2 idle cores, longer on a busy machine"

// KubeAPIServerBinary returns the path of a kube-apiserver [KubeAPIServerVersion]
// binary, as [KubeAPIServerReleaseBinary] does for that release.
func KubeAPIServerBinary(ctx context.Context) (string, error) {
	return KubeAPIServerReleaseBinary(ctx, KubeAPIServerVersion)
}

// KubeAPIServerReleaseBinary returns the path of a stock kube-apiserver binary of
// release, one of [KubeAPIServerReleases]; "" means [KubeAPIServerVersion]. It is
// the value of $CLUSTERIP_KUBE_APISERVER (for [KubeAPIServerVersion] only) or of
// [KubeAPIServerReleaseEnv] if set, else
// <repo root>/.cache/kube-apiserver-<release>/kube-apiserver.
//
// If the cached binary is missing, KubeAPIServerReleaseBinary builds it from the
// nested module internal/kubeapiserver/<release> with "go build", which takes
// about 7 minutes and 2 GiB of RAM on 2 cores (v1.37, 10 minutes); it says so
// once on stderr when it starts. The binary answers --version with release.
// Concurrent callers, in this process or in other test binaries, wait on a file
// lock in .cache and build it once; if a build failed since the calling process
// started, they return its error instead of building again. The build runs at a
// lower CPU priority, and cancelling ctx stops the wait or the build. It fails
// for a release that is not supported, and if the repository root cannot be
// found from the source location or the working directory.
func KubeAPIServerReleaseBinary(ctx context.Context, release string) (string, error) {
	release, err := checkRelease(release)
	if err != nil {
		return "", err
	}
	if p, set, err := envBinary(release); set {
		return p, err
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	modDir := stockModuleDir(root, release)
	return cachedBuildAt(ctx, cachedReleaseBinary(filepath.Join(root, ".cache"), release), "kube-apiserver "+release, buildEstimate,
		func(ctx context.Context, out string) error {
			return goBuild(ctx, modDir, out, release, "kube-apiserver "+release)
		}, notify)
}

// checkRelease returns release, or [KubeAPIServerVersion] for "", and an error
// naming the supported releases if it is not one of them.
func checkRelease(release string) (string, error) {
	if release == "" {
		return KubeAPIServerVersion, nil
	}
	if !slices.Contains(kubeAPIServerReleases, release) {
		return "", fmt.Errorf("localcluster: kube-apiserver %s is not a supported release (%s)",
			release, strings.Join(kubeAPIServerReleases, ", "))
	}
	return release, nil
}

// stockModuleDir returns the nested module that builds stock kube-apiserver release.
func stockModuleDir(root, release string) string {
	return filepath.Join(root, "internal", "kubeapiserver", release)
}

// CachedKubeAPIServerBinary returns the path of the kube-apiserver binary that
// [KubeAPIServerBinary] would return, if it exists, without ever building it:
// the value of $CLUSTERIP_KUBE_APISERVER if it is set, else the cached build
// <repo root>/.cache/kube-apiserver-v1.33.13/kube-apiserver. When that file
// does not exist the error matches [os.ErrNotExist] and names the path; it
// also fails if the repository root cannot be found. It is for callers that
// use a kube-apiserver only when one is at hand, such as "clusterip bench".
func CachedKubeAPIServerBinary() (string, error) {
	return CachedKubeAPIServerReleaseBinary(KubeAPIServerVersion)
}

// CachedKubeAPIServerReleaseBinary returns the path of the stock kube-apiserver binary of
// release that [KubeAPIServerReleaseBinary] would return, if it exists, without ever building
// it, as [CachedKubeAPIServerBinary] does for [KubeAPIServerVersion]: the binary the environment
// names, else <repo root>/.cache/kube-apiserver-<release>/kube-apiserver. A missing file gives an
// error that matches [os.ErrNotExist] and says how to build it.
func CachedKubeAPIServerReleaseBinary(release string) (string, error) {
	release, err := checkRelease(release)
	if err != nil {
		return "", err
	}
	if p, set, err := envBinary(release); set {
		return p, err
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := cachedReleaseBinary(filepath.Join(root, ".cache"), release)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("localcluster: kube-apiserver %s is not built yet (go run ./internal/localcluster/cmd/build-kube-apiserver -release %s builds it): %w",
			release, release, err)
	}
	return bin, nil
}

// envBinary returns the binary the environment names for release
// ($CLUSTERIP_KUBE_APISERVER for [KubeAPIServerVersion], then
// [KubeAPIServerReleaseEnv]) and whether one is set; if one is, err reports a
// missing file.
func envBinary(release string) (path string, set bool, err error) {
	names := []string{KubeAPIServerReleaseEnv(release)}
	if release == KubeAPIServerVersion {
		names = append([]string{KubeAPIServerEnv}, names...)
	}
	for _, name := range names {
		p := os.Getenv(name)
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return "", true, fmt.Errorf("localcluster: $%s: %w", name, err)
		}
		return p, true, nil
	}
	return "", false, nil
}

// cachedBinary returns where the build of [KubeAPIServerVersion] is cached under cacheDir.
func cachedBinary(cacheDir string) string {
	return cachedReleaseBinary(cacheDir, KubeAPIServerVersion)
}

// cachedReleaseBinary returns where the stock build of release is cached under cacheDir.
func cachedReleaseBinary(cacheDir, release string) string {
	return filepath.Join(cacheDir, "kube-apiserver-"+release, "kube-apiserver")
}

// cachedBuild returns <cacheDir>/kube-apiserver-<version>/kube-apiserver,
// calling build to write it first if it is missing; see [KubeAPIServerBinary].
// build writes the binary to out, a temporary file that cachedBuild renames
// into place when build succeeds; say tells the user about long waits.
func cachedBuild(ctx context.Context, cacheDir string, build func(ctx context.Context, out string) error, say func(format string, args ...any)) (string, error) {
	return cachedBuildAt(ctx, cachedBinary(cacheDir), "kube-apiserver "+KubeAPIServerVersion, buildEstimate, build, say)
}

// cachedBuildAt returns bin, calling build to write it first if it is missing, under a lock
// file beside bin's directory; what names the binary in messages, such as
// "kube-apiserver v1.33.13", and estimate says what the build takes. See [cachedBuild].
func cachedBuildAt(ctx context.Context, bin, what, estimate string, build func(ctx context.Context, out string) error, say func(format string, args ...any)) (string, error) {
	dir := filepath.Dir(bin)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	unlock, err := lockFile(ctx, dir+".lock", func() {
		say("waiting for another process that is building %s into %s (%s, once per clone)",
			what, dir, estimate)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock, or
	// failed to. A build that failed since this process started would most
	// likely fail the same way after as long, so report that failure instead
	// of trying again; the next test run tries again.
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	failed := filepath.Join(dir, "build-failed.log")
	if fi, err := os.Stat(failed); err == nil && fi.ModTime().After(processStart) {
		log, _ := os.ReadFile(failed)
		return "", fmt.Errorf("localcluster: building %s failed earlier in this run (log in %s):\n%s",
			what, failed, tail(string(log), 40))
	}
	// Partial outputs of builds whose process was killed; nobody else builds
	// while we hold the lock.
	prefix := filepath.Base(bin) + "-build-"
	if stale, err := filepath.Glob(filepath.Join(dir, prefix+"*")); err == nil {
		for _, f := range stale {
			os.Remove(f)
		}
	}
	tmp, err := os.CreateTemp(dir, prefix)
	if err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // no-op after the rename

	say("building %s from source for the integration tests (%s, once per clone; cached in %s)",
		what, estimate, dir)
	start := time.Now()
	if err := build(ctx, tmp.Name()); err != nil {
		if ctx.Err() == nil {
			os.WriteFile(failed, []byte(err.Error()), 0o644)
		}
		return "", err
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	os.Remove(failed)
	say("built %s in %v: %s", what, time.Since(start).Round(time.Second), bin)
	return bin, nil
}

// goBuild builds kube-apiserver release from the module in modDir into out, with flags (such as the
// fork's -modfile and -overlay) before the common ones, and names what it builds in its error.
// The stock and fork builds share this one command line, so that they compile the same packages
// with the same flags and share the compile cache.
func goBuild(ctx context.Context, modDir, out, release, what string, flags ...string) error {
	major, minor, _ := strings.Cut(strings.TrimPrefix(release, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	ldflags := "-X k8s.io/component-base/version.gitVersion=" + release +
		" -X k8s.io/component-base/version.gitMajor=" + major + " -X k8s.io/component-base/version.gitMinor=" + minor
	args := append([]string{"build"}, flags...)
	args = append(args, "-trimpath", "-o", out, "-ldflags", ldflags, "k8s.io/kubernetes/cmd/kube-apiserver")
	return runGo(ctx, modDir, what, args...)
}

// runGo runs the go command with args in the nested module modDir, on its own: a go.work that a
// user keeps above the repository must not pull the library's module into it, and flags meant
// for the user's own builds (-race, -mod=vendor) must not change it. Its output goes into the
// error, which names what was being built.
func runGo(ctx context.Context, modDir, what string, args ...string) error {
	cmd := niceCommand(ctx, "go", args...)
	cmd.Dir = modDir
	env, err := nestedGoEnv(modDir)
	if err != nil {
		return err
	}
	cmd.Env = env
	cmd.SysProcAttr = childProcAttr()
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("localcluster: build %s in %s: %w\n%s", what, modDir, err, log.Bytes())
	}
	return nil
}

// NestedGoEnv returns the environment of a go command run in the nested build module modDir
// (a stock release's or a fork's): the process's own, with GOWORK=off and GOFLAGS cleared, and,
// when the module's go.mod names a toolchain (a release that needs a newer Go than the library,
// such as v1.38's go 1.27), GOTOOLCHAIN set to it, so that the go command runs that toolchain
// (downloaded from the module proxy once) whatever GOTOOLCHAIN the machine sets, while the
// library's own module keeps building with the Go at hand.
func NestedGoEnv(modDir string) ([]string, error) {
	return nestedGoEnv(modDir)
}

// nestedGoEnv is [NestedGoEnv].
func nestedGoEnv(modDir string) ([]string, error) {
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	tc, err := moduleToolchain(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return nil, err
	}
	if tc != "" {
		env = append(env, "GOTOOLCHAIN="+tc)
	}
	return env, nil
}

// moduleToolchain returns the toolchain line of the go.mod file at path ("go1.27.3"), or "" if
// it has none.
func moduleToolchain(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "toolchain "); ok {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", nil
}

// niceCommand returns a command that runs name with args at a lower CPU
// priority where the nice command exists, so that a build started by one
// test package does not starve the timing-sensitive tests that other
// packages run beside it.
func niceCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	if nice, err := exec.LookPath("nice"); err == nil && runtime.GOOS != "windows" {
		return exec.CommandContext(ctx, nice, append([]string{"-n", "10", name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// notify writes one line about a long wait to stderr. Under "go test" with
// several packages stderr is held back until the package finishes, so when
// stderr is not a terminal the line also goes to the controlling terminal,
// if there is one, where a person waiting can read it at once.
func notify(format string, args ...any) {
	line := "clusterip: " + fmt.Sprintf(format, args...) + "\n"
	io.WriteString(os.Stderr, line)
	if isTerminal(os.Stderr) {
		return
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		io.WriteString(tty, line)
		tty.Close()
	}
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// repoRoot returns the directory holding the go.mod of the library's module.
// It looks next to this source file first, then walks up from the working
// directory, which also works for binaries built with -trimpath.
func repoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		if isModuleRoot(dir) {
			return dir, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if isModuleRoot(dir) {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	return "", errors.New("localcluster: cannot find the repository root (the go.mod of module " + modulePath +
		") from the source location or " + wd + "; set $" + KubeAPIServerEnv)
}

// isModuleRoot reports whether dir holds the go.mod of the library's module.
func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`) == modulePath
		}
	}
	return false
}
