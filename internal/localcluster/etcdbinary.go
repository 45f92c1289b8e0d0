package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// EtcdVersion is the version of the etcd server that [EtcdBinary] builds: the one
// kube-apiserver v1.33 requires.
const EtcdVersion = "v3.5.21"

// EtcdEnv names the environment variable that, when set, gives the path of an etcd server
// binary to use instead of the cached build. It must be a build of the nested module
// internal/localcluster/etcdserver, which takes its configuration as one JSON argument.
const EtcdEnv = "CLUSTERIP_ETCD"

// etcdModuleDir is where the etcd server's nested module lives, relative to the repository root.
const etcdModuleDir = "internal/localcluster/etcdserver"

// etcdBuildEstimate is what the first build of the etcd server tells the user to expect.
const etcdBuildEstimate = "a minute or two on 2 cores, longer on a busy machine"

// EtcdBinary returns the path of the etcd server that [StartEtcd] and [StartEtcdCluster] run:
// the value of $CLUSTERIP_ETCD if it is set, else
// <repo root>/.cache/etcd-v3.5.21-<hash>/etcd, where hash covers the files of the nested module
// internal/localcluster/etcdserver (its go.mod, go.sum and source, package embedded's too).
//
// If that binary is missing, EtcdBinary builds it from that module with "go build" as
// [KubeAPIServerBinary] builds kube-apiserver: once per clone, under the same kind of lock and
// failure record, with GOWORK=off and GOFLAGS cleared, so that go.etcd.io/etcd/server/v3 stays
// out of the library's module graph. Cancelling ctx stops the wait or the build.
func EtcdBinary(ctx context.Context) (string, error) {
	if p := os.Getenv(EtcdEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("localcluster: $%s: %w", EtcdEnv, err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("%w (for etcd, $%s)", err, EtcdEnv)
	}
	modDir := filepath.Join(root, filepath.FromSlash(etcdModuleDir))
	sum, err := etcdInputsHash(modDir)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "etcd-"+EtcdVersion+"-"+sum, "etcd")
	what := "etcd " + EtcdVersion
	return cachedBuildAt(ctx, bin, what, etcdBuildEstimate, func(ctx context.Context, out string) error {
		return runGo(ctx, modDir, what, "build", "-trimpath", "-o", out, ".")
	}, notify)
}

// etcdInputsHash returns the first 12 hex digits of a SHA-256 of the files under modDir, the etcd
// server's module, with their paths.
func etcdInputsHash(modDir string) (string, error) {
	var names []string
	err := filepath.WalkDir(modDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(modDir, path)
			if err != nil {
				return err
			}
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("localcluster: hash the etcd server's inputs: %w", err)
	}
	slices.Sort(names)
	h := sha256.New()
	fmt.Fprintf(h, "etcd %s\n", EtcdVersion)
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(modDir, filepath.FromSlash(name)))
		if err != nil {
			return "", fmt.Errorf("localcluster: hash the etcd server's inputs: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
