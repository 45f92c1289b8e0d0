package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// KubeAPIServerVersion is the version of the kube-apiserver that
// KubeAPIServerBinary builds. It is v1.33 because v1.34 and later lock the
// MultiCIDRServiceAllocator feature gate on, and the interop tests need a
// peer that still runs the legacy bitmap allocator.
const KubeAPIServerVersion = "v1.33.13"

// KubeAPIServerEnv names the environment variable that, when set, gives the
// path of a kube-apiserver binary to use instead of the cached build.
const KubeAPIServerEnv = "CLUSTERIP_KUBE_APISERVER"

// modulePath is the path of the library's module, whose go.mod marks the
// repository root.
const modulePath = "github.com/kube-ipam/clusterip"

// KubeAPIServerBinary returns the path of a kube-apiserver binary: the value
// of $CLUSTERIP_KUBE_APISERVER if it is set, else
// <repo root>/.cache/kube-apiserver-v1.33.13/kube-apiserver.
//
// If the cached binary is missing, KubeAPIServerBinary builds it from the
// nested module internal/kubeapiserver with "go build", which takes about
// 6 minutes and 2 GiB of RAM on 2 cores. Concurrent callers, in this process
// or in other test binaries, wait on a file lock in .cache and build it once.
// Cancelling ctx stops the wait or the build. It fails if the repository root
// cannot be found from the source location or the working directory.
func KubeAPIServerBinary(ctx context.Context) (string, error) {
	if p := os.Getenv(KubeAPIServerEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("testenv: $%s: %w", KubeAPIServerEnv, err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cacheDir := filepath.Join(root, ".cache")
	bin := filepath.Join(cacheDir, "kube-apiserver-"+KubeAPIServerVersion, "kube-apiserver")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, "kube-apiserver-"+KubeAPIServerVersion+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := buildKubeAPIServer(ctx, filepath.Join(root, "internal", "kubeapiserver"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// buildKubeAPIServer builds kube-apiserver from the module in modDir into a
// temporary file next to bin, and renames it to bin when the build succeeds.
func buildKubeAPIServer(ctx context.Context, modDir, bin string) error {
	tmp, err := os.CreateTemp(filepath.Dir(bin), "kube-apiserver-build-")
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // no-op after the rename
	ldflags := "-X k8s.io/component-base/version.gitVersion=" + KubeAPIServerVersion +
		" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=33"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp.Name(), "-ldflags", ldflags,
		"k8s.io/kubernetes/cmd/kube-apiserver")
	cmd.Dir = modDir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testenv: build kube-apiserver %s in %s: %w\n%s", KubeAPIServerVersion, modDir, err, out.Bytes())
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
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
		return "", fmt.Errorf("testenv: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if isModuleRoot(dir) {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	return "", errors.New("testenv: cannot find the repository root (the go.mod of module " + modulePath +
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
