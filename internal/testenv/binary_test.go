package testenv

import (
	"context"
	"os"
	"path/filepath"
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

func TestRepoRootFindsLibraryModule(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "kubeapiserver", "go.mod")); err != nil {
		t.Errorf("repoRoot() = %s, which has no internal/kubeapiserver/go.mod: %v", root, err)
	}
	if isModuleRoot(filepath.Join(root, "internal", "kubeapiserver")) {
		t.Errorf("isModuleRoot(nested kubeapiserver module) = true, want false")
	}
}

func TestLockFileIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if unlock2, err := lockFile(ctx, path); err == nil {
		unlock2()
		t.Fatalf("lockFile() of a held lock succeeded, want it to wait until ctx is done")
	}
	unlock()
	unlock3, err := lockFile(context.Background(), path)
	if err != nil {
		t.Fatalf("lockFile() after unlock: %v", err)
	}
	unlock3()
}
