package localcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// KubeAPIServerForkEnv names the environment variable that, when set, gives the path of a
// kube-apiserver fork binary to use instead of the cached build.
const KubeAPIServerForkEnv = "CLUSTERIP_KUBE_APISERVER_FORK"

// forkModuleDir is where the fork's nested module lives, relative to the repository root.
const forkModuleDir = "internal/kubeapiserverfork"

// KubeAPIServerForkBinary returns the path of the kube-apiserver fork on clusterip: the value
// of $CLUSTERIP_KUBE_APISERVER_FORK if it is set, else
// <repo root>/.cache/kube-apiserver-v1.33.13-fork-<hash>/kube-apiserver, where hash covers
// everything the build reads from the repository: the fork module's go.mod and go.sum, its
// patches and overlay files, and the library's non-test Go files and go.mod.
//
// If that binary is missing, KubeAPIServerForkBinary builds it as [KubeAPIServerBinary] builds
// the stock one, with its lock, failure record and messages; see buildFork for how. A patch
// that no longer applies to the pristine k8s.io/kubernetes file fails the build, naming the
// line.
func KubeAPIServerForkBinary(ctx context.Context) (string, error) {
	if p := os.Getenv(KubeAPIServerForkEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("localcluster: $%s: %w", KubeAPIServerForkEnv, err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	sum, err := forkInputsHash(root)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "kube-apiserver-"+KubeAPIServerVersion+"-fork-"+sum, "kube-apiserver")
	return cachedBuildAt(ctx, bin, "kube-apiserver "+KubeAPIServerVersion+" fork on clusterip", buildEstimate, func(ctx context.Context, out string) error {
		return buildFork(ctx, root, filepath.Join(filepath.Dir(bin), "src"), out)
	}, notify)
}

// forkInputsHash returns the first 12 hex digits of a SHA-256 of every file the fork's build
// reads from the repository under root, with their paths.
func forkInputsHash(root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "kube-apiserver %s fork\n", KubeAPIServerVersion)
	add := func(path string) error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(data))
		h.Write(data)
		return nil
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path == root {
				return nil
			}
			if strings.HasPrefix(name, ".") || name == "testdata" {
				return filepath.SkipDir
			}
			fork := filepath.Join(root, filepath.FromSlash(forkModuleDir))
			if path != fork && !strings.HasPrefix(path, fork+string(filepath.Separator)) {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module, such as cmd/clusterip
				}
			}
			return nil
		}
		switch {
		case strings.HasPrefix(path, filepath.Join(root, filepath.FromSlash(forkModuleDir))+string(filepath.Separator)):
			if strings.HasSuffix(name, "_test.go") {
				return nil
			}
			return add(path)
		case name == "go.mod" || name == "go.sum" || strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
			return add(path)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("localcluster: hash the fork's inputs: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// buildFork builds the kube-apiserver fork into out, with work as its scratch directory.
//
// Go refuses -overlay replacements of files inside GOMODCACHE, so the build reaches the pristine
// k8s.io/kubernetes module through a symbolic link in work, which a copy of the fork module's
// go.mod (passed with -modfile) puts in place of the module with a replace directive. Each patch
// is applied to its pristine file into work/patched; overlay.json maps the file's path under the
// link to the patched copy, and each file of the module's _overlay directory to a new file of the
// same package. Then:
//
//	GOWORK=off GOFLAGS= go build -modfile work/go.mod -trimpath -overlay work/overlay.json \
//	  -ldflags "-X k8s.io/component-base/version.gitVersion=v1.33.13 …" k8s.io/kubernetes/cmd/kube-apiserver
//
// from the fork module's directory. The staging modules and everything else still come from the
// module cache, so their compiled packages are shared with the stock build; the packages of
// k8s.io/kubernetes itself are compiled again, once, because they now come from a directory.
func buildFork(ctx context.Context, root, work, out string) error {
	modDir := filepath.Join(root, filepath.FromSlash(forkModuleDir))
	if err := os.RemoveAll(work); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(work, "patched"), 0o755); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	pristine, err := kubernetesModuleDir(ctx, modDir)
	if err != nil {
		return err
	}
	link := filepath.Join(work, "kubernetes")
	if err := os.Symlink(pristine, link); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	overlay, err := forkOverlay(modDir, pristine, link, filepath.Join(work, "patched"))
	if err != nil {
		return err
	}
	overlayJSON, err := json.MarshalIndent(struct{ Replace map[string]string }{overlay}, "", "\t")
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "overlay.json"), overlayJSON, 0o644); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	mod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	mod = append(mod, fmt.Sprintf("\n// Added by the build: the pristine module through a link, patched with -overlay.\nreplace k8s.io/kubernetes => %s\n", link)...)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), mod, 0o644); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := copyFile(filepath.Join(modDir, "go.sum"), filepath.Join(work, "go.sum")); err != nil {
		return err
	}
	return goBuild(ctx, modDir, out, KubeAPIServerVersion, "the kube-apiserver "+KubeAPIServerVersion+" fork",
		"-modfile", filepath.Join(work, "go.mod"), "-overlay", filepath.Join(work, "overlay.json"))
}

// kubernetesModuleDir returns the module cache directory of the k8s.io/kubernetes module that
// the fork module requires, downloading it if needed.
func kubernetesModuleDir(ctx context.Context, modDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "k8s.io/kubernetes")
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("localcluster: go mod download k8s.io/kubernetes in %s: %w\n%s%s", modDir, err, data, stderr.Bytes())
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(data, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("localcluster: go mod download k8s.io/kubernetes: no directory (%v%s)", err, m.Error)
	}
	return m.Dir, nil
}

// forkOverlay applies the fork module's patches to the pristine files into patched and returns
// the -overlay replacements: each patched file, and each file of the _overlay directory, under
// link, the path by which the build reaches the pristine module.
func forkOverlay(modDir, pristine, link, patched string) (map[string]string, error) {
	replace := map[string]string{}
	patches, err := filepath.Glob(filepath.Join(modDir, "patches", "*.patch"))
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if len(patches) == 0 {
		return nil, fmt.Errorf("localcluster: no patch in %s", filepath.Join(modDir, "patches"))
	}
	slices.Sort(patches)
	for _, pf := range patches {
		data, err := os.ReadFile(pf)
		if err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		p, err := parsePatch(data)
		if err != nil {
			return nil, fmt.Errorf("localcluster: patch %s: %w", pf, err)
		}
		src, err := os.ReadFile(filepath.Join(pristine, filepath.FromSlash(p.path)))
		if err != nil {
			return nil, fmt.Errorf("localcluster: patch %s: %w", pf, err)
		}
		res, err := p.apply(src)
		if err != nil {
			return nil, fmt.Errorf("localcluster: patch %s no longer applies to k8s.io/kubernetes@%s: %w", filepath.Base(pf), KubeAPIServerVersion, err)
		}
		dst := filepath.Join(patched, filepath.FromSlash(p.path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		if err := os.WriteFile(dst, res, 0o644); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		replace[filepath.Join(link, filepath.FromSlash(p.path))] = dst
	}
	overlayDir := filepath.Join(modDir, "_overlay")
	err = filepath.WalkDir(overlayDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(overlayDir, path)
		if err != nil {
			return err
		}
		target := filepath.Join(link, rel)
		if _, err := os.Stat(filepath.Join(pristine, rel)); err == nil {
			return fmt.Errorf("%s would replace an upstream file: change upstream files with a patch", path)
		}
		if _, err := os.Stat(filepath.Dir(filepath.Join(pristine, rel))); err != nil {
			return fmt.Errorf("%s adds a file to a package k8s.io/kubernetes@%s does not have: %w", path, KubeAPIServerVersion, err)
		}
		replace[target] = path
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("localcluster: overlay: %w", err)
	}
	return replace, nil
}

// copyFile copies the file src to dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("localcluster: %w", err)
	}
	return out.Close()
}

// KubeAPIServerForkGoFlags returns the flags that make a go command run in the fork module's
// directory (dir) build k8s.io/kubernetes packages as the fork's build does, patched: -modfile,
// -overlay and -trimpath. Run such commands with GOWORK=off. They use a copy of the build's
// go.mod and go.sum in scratch, so that -mod=mod, which upstream's own tests need for modules
// kube-apiserver does not, changes neither the build nor the repository. It builds the fork
// first if needed (see [KubeAPIServerForkBinary]), and fails if $CLUSTERIP_KUBE_APISERVER_FORK
// names a binary built elsewhere.
func KubeAPIServerForkGoFlags(ctx context.Context, scratch string) (dir string, flags []string, err error) {
	if p := os.Getenv(KubeAPIServerForkEnv); p != "" {
		return "", nil, fmt.Errorf("localcluster: $%s is set: the fork was built elsewhere, so its build flags are unknown", KubeAPIServerForkEnv)
	}
	bin, err := KubeAPIServerForkBinary(ctx)
	if err != nil {
		return "", nil, err
	}
	root, err := repoRoot()
	if err != nil {
		return "", nil, err
	}
	src := filepath.Join(filepath.Dir(bin), "src")
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := copyFile(filepath.Join(src, f), filepath.Join(scratch, f)); err != nil {
			return "", nil, err
		}
	}
	return filepath.Join(root, filepath.FromSlash(forkModuleDir)),
		[]string{"-modfile", filepath.Join(scratch, "go.mod"), "-overlay", filepath.Join(src, "overlay.json"), "-trimpath"}, nil
}
