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
// kube-apiserver [KubeAPIServerVersion] fork binary to use instead of the cached build. See
// [KubeAPIServerForkReleaseEnv] for the other releases.
const KubeAPIServerForkEnv = "CLUSTERIP_KUBE_APISERVER_FORK"

// KubeAPIServerForkReleaseEnv returns the name of the environment variable that, when set, gives
// the path of a fork binary of release to use instead of the cached build:
// CLUSTERIP_KUBE_APISERVER_FORK_V1_37 for "v1.37.2", one per minor. For [KubeAPIServerVersion],
// [KubeAPIServerForkEnv] comes first.
func KubeAPIServerForkReleaseEnv(release string) string {
	return KubeAPIServerForkEnv + strings.TrimPrefix(KubeAPIServerReleaseEnv(release), KubeAPIServerEnv)
}

// forksDir is where the forks live, one folder per release, relative to the repository root.
const forksDir = "forks"

// forkDir returns the folder of release's fork: its build module (go.mod, go.sum), patches/ and
// files/.
func forkDir(root, release string) string {
	return filepath.Join(root, forksDir, release)
}

// commonFilesDir returns the folder of the new files every release's fork adds, at their path in
// the kubernetes tree, besides those of its own files/: forks/common/files.
func commonFilesDir(forkDir string) string {
	return filepath.Join(filepath.Dir(forkDir), "common", "files")
}

// KubeAPIServerForkBinary returns the path of the kube-apiserver [KubeAPIServerVersion] fork, as
// [KubeAPIServerForkReleaseBinary] does for that release.
func KubeAPIServerForkBinary(ctx context.Context) (string, error) {
	return KubeAPIServerForkReleaseBinary(ctx, KubeAPIServerVersion)
}

// KubeAPIServerForkReleaseBinary returns the path of the kube-apiserver fork on clusterip of
// release, one of [KubeAPIServerReleases] ("" means [KubeAPIServerVersion]): the value of
// $CLUSTERIP_KUBE_APISERVER_FORK (for [KubeAPIServerVersion] only) or of
// [KubeAPIServerForkReleaseEnv] if set, else
// <repo root>/.cache/kube-apiserver-<release>-fork-<hash>/kube-apiserver, where hash covers
// everything the build reads from the repository: the go.mod, go.sum, patches and new files of
// forks/<release>, the new files of forks/common, and the library's non-test Go files and go.mod.
//
// If that binary is missing, KubeAPIServerForkReleaseBinary builds it as
// [KubeAPIServerReleaseBinary] builds the stock one, with its lock, failure record and messages;
// see buildFork for how. A patch that no longer applies to the pristine k8s.io/kubernetes file
// fails the build, naming the line. The binary answers --version with release.
func KubeAPIServerForkReleaseBinary(ctx context.Context, release string) (string, error) {
	release, err := checkRelease(release)
	if err != nil {
		return "", err
	}
	if p, set, err := envForkBinary(release); set {
		return p, err
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin, err := forkBinaryPath(root, release)
	if err != nil {
		return "", err
	}
	return cachedBuildAt(ctx, bin, "kube-apiserver "+release+" fork on clusterip", buildEstimate, func(ctx context.Context, out string) error {
		return buildFork(ctx, root, release, filepath.Join(filepath.Dir(bin), "src"), out)
	}, notify)
}

// envForkBinary returns the fork binary the environment names for release
// ($CLUSTERIP_KUBE_APISERVER_FORK for [KubeAPIServerVersion], then
// [KubeAPIServerForkReleaseEnv]) and whether one is set; if one is, err reports a missing file.
func envForkBinary(release string) (path string, set bool, err error) {
	names := []string{KubeAPIServerForkReleaseEnv(release)}
	if release == KubeAPIServerVersion {
		names = append([]string{KubeAPIServerForkEnv}, names...)
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

// forkBinaryPath returns where the fork of release is cached, under a hash of its inputs; it
// fails if the repository has no fork of release.
func forkBinaryPath(root, release string) (string, error) {
	if _, err := os.Stat(filepath.Join(forkDir(root, release), "go.mod")); err != nil {
		return "", fmt.Errorf("localcluster: no fork of kube-apiserver %s in %s: %w", release, forksDir, err)
	}
	sum, err := forkInputsHash(root, release)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "kube-apiserver-"+release+"-fork-"+sum, "kube-apiserver"), nil
}

// forkInputsHash returns the first 12 hex digits of a SHA-256 of every file the build of
// release's fork reads from the repository under root, with their paths: forks/<release>'s
// go.mod, go.sum, patches and new files (not its guide, nor the whole-change patch made from
// them), forks/common's new files, and the library module's go.mod, go.sum and non-test Go files.
func forkInputsHash(root, release string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "kube-apiserver %s fork\n", release)
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
	fork := forkDir(root, release)
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
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module, such as cmd/clusterip or a fork's
			}
			return nil
		}
		if name == "go.mod" || name == "go.sum" || strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			return add(path)
		}
		return nil
	})
	if err == nil {
		for _, f := range []string{"go.mod", "go.sum"} {
			if err = add(filepath.Join(fork, f)); err != nil {
				break
			}
		}
	}
	for _, dir := range []string{filepath.Join(fork, "patches"), filepath.Join(fork, "files"), commonFilesDir(fork)} {
		if err != nil {
			break
		}
		err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			return add(path)
		})
	}
	if err != nil {
		return "", fmt.Errorf("localcluster: hash the inputs of the kube-apiserver %s fork: %w", release, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// buildFork builds the kube-apiserver fork of release into out, with work as its scratch
// directory; see prepareFork for how it reaches the patched source. Then:
//
//	GOWORK=off GOFLAGS= go build -modfile work/go.mod -trimpath -overlay work/overlay.json \
//	  -ldflags "-X k8s.io/component-base/version.gitVersion=<release> …" k8s.io/kubernetes/cmd/kube-apiserver
//
// from forks/<release>. The staging modules and everything else still come from the module
// cache, so their compiled packages are shared with the stock build; the packages of
// k8s.io/kubernetes itself are compiled again, once, because they now come from a directory.
func buildFork(ctx context.Context, root, release, work, out string) error {
	flags, _, err := prepareFork(ctx, root, release, work)
	if err != nil {
		return err
	}
	return goBuild(ctx, forkDir(root, release), out, release, "the kube-apiserver "+release+" fork", flags...)
}

// prepareFork writes into work (emptied first) what a go command run in forks/<release> needs to
// see k8s.io/kubernetes patched, and returns the flags that make it do so (-modfile, -overlay)
// and the import paths of the packages the fork changes or adds files to.
//
// Go refuses -overlay replacements of files inside GOMODCACHE, so the build reaches the pristine
// k8s.io/kubernetes module through a symbolic link in work, which a copy of the fork module's
// go.mod (passed with -modfile) puts in place of the module with a replace directive. Each patch
// is applied to its pristine file into work/patched; overlay.json maps the file's path under the
// link to the patched copy, and each file of the fork's files/ directory and of forks/common/files
// to a new file of the same package.
func prepareFork(ctx context.Context, root, release, work string) (flags, pkgs []string, err error) {
	modDir := forkDir(root, release)
	if err := os.RemoveAll(work); err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(work, "patched"), 0o755); err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	pristine, err := kubernetesModuleDir(ctx, modDir)
	if err != nil {
		return nil, nil, err
	}
	link := filepath.Join(work, "kubernetes")
	if err := os.Symlink(pristine, link); err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	overlay, err := forkOverlay(modDir, release, pristine, link, filepath.Join(work, "patched"))
	if err != nil {
		return nil, nil, err
	}
	overlayJSON, err := json.MarshalIndent(struct{ Replace map[string]string }{overlay}, "", "\t")
	if err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "overlay.json"), overlayJSON, 0o644); err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	mod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	mod = append(mod, fmt.Sprintf("\n// Added by the build: the pristine module through a link, patched with -overlay.\nreplace k8s.io/kubernetes => %s\n", link)...)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), mod, 0o644); err != nil {
		return nil, nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := copyFile(filepath.Join(modDir, "go.sum"), filepath.Join(work, "go.sum")); err != nil {
		return nil, nil, err
	}
	for target := range overlay {
		rel, err := filepath.Rel(link, filepath.Dir(target))
		if err != nil {
			return nil, nil, fmt.Errorf("localcluster: %w", err)
		}
		if pkg := "k8s.io/kubernetes/" + filepath.ToSlash(rel); !slices.Contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
	}
	slices.Sort(pkgs)
	return []string{"-modfile", filepath.Join(work, "go.mod"), "-overlay", filepath.Join(work, "overlay.json")}, pkgs, nil
}

// CheckKubeAPIServerFork applies the patches of release's fork to the pristine k8s.io/kubernetes
// module, adds its new files, and compiles the packages they change (not kube-apiserver), as the
// fork's build would, in a temporary directory: a few minutes where building the whole fork
// takes ten. It returns those packages, or the error of the patch or of the compiler.
func CheckKubeAPIServerFork(ctx context.Context, release string) ([]string, error) {
	release, err := checkRelease(release)
	if err != nil {
		return nil, err
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	if _, err := forkBinaryPath(root, release); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "localcluster-fork-check-")
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	defer os.RemoveAll(work)
	flags, pkgs, err := prepareFork(ctx, root, release, work)
	if err != nil {
		return nil, err
	}
	args := append([]string{"build"}, flags...)
	args = append(args, "-trimpath")
	args = append(args, pkgs...)
	return pkgs, runGo(ctx, forkDir(root, release), "the packages of the kube-apiserver "+release+" fork", args...)
}

// kubernetesModuleDir returns the module cache directory of the k8s.io/kubernetes module that
// the fork module requires, downloading it if needed.
func kubernetesModuleDir(ctx context.Context, modDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "k8s.io/kubernetes")
	cmd.Dir = modDir
	env, err := nestedGoEnv(modDir)
	if err != nil {
		return "", err
	}
	cmd.Env = env
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

// forkOverlay applies the patches of the fork in modDir, of release, to the pristine files into
// patched and returns the -overlay replacements: each patched file, and each file of the files/
// directory and of forks/common/files, under link, the path by which the build reaches the
// pristine module. A new file in both is an error.
func forkOverlay(modDir, release, pristine, link, patched string) (map[string]string, error) {
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
			return nil, fmt.Errorf("localcluster: patch %s no longer applies to k8s.io/kubernetes@%s: %w", filepath.Base(pf), release, err)
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
	for _, overlayDir := range []string{commonFilesDir(modDir), filepath.Join(modDir, "files")} {
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
				return fmt.Errorf("%s adds a file to a package k8s.io/kubernetes@%s does not have: %w", path, release, err)
			}
			if other, ok := replace[target]; ok {
				return fmt.Errorf("%s and %s add the same file", other, path)
			}
			replace[target] = path
			return nil
		})
		if err != nil {
			break
		}
	}
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

// KubeAPIServerForkGoFlags returns the flags that make a go command run in dir, the build module
// of release's fork (forks/<release>), build k8s.io/kubernetes packages as the fork's build does,
// patched: -modfile, -overlay and -trimpath. Run such commands with GOWORK=off. They use a copy
// of the build's go.mod and go.sum in scratch, so that -mod=mod, which upstream's own tests need
// for modules kube-apiserver does not, changes neither the build nor the repository. It builds
// the fork first if needed (see [KubeAPIServerForkReleaseBinary]), and fails if the environment
// names a fork binary of release built elsewhere.
func KubeAPIServerForkGoFlags(ctx context.Context, release, scratch string) (dir string, flags []string, err error) {
	release, err = checkRelease(release)
	if err != nil {
		return "", nil, err
	}
	if _, set, _ := envForkBinary(release); set {
		return "", nil, fmt.Errorf("localcluster: $%s is set: the fork was built elsewhere, so its build flags are unknown", KubeAPIServerForkReleaseEnv(release))
	}
	bin, err := KubeAPIServerForkReleaseBinary(ctx, release)
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
	return forkDir(root, release),
		[]string{"-modfile", filepath.Join(scratch, "go.mod"), "-overlay", filepath.Join(src, "overlay.json"), "-trimpath"}, nil
}
