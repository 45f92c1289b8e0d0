package testenv

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// Kustomize renders the kustomization in dir, a path relative to the repository root
// ("deploy/webhook-cert-manager") or an absolute one, as "kubectl kustomize" would, and returns
// its objects in kustomize's output order. It runs the nested module internal/kustomizebuild
// (sigs.k8s.io/kustomize/api's krusty, kept out of the workspace's module graphs) with "go run",
// outside the workspace: a few seconds once its build is cached. It fails t if the build fails.
func Kustomize(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	root := repoRoot(t)
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	modDir := filepath.Join(root, "internal", "kustomizebuild")
	env, err := localcluster.NestedGoEnv(modDir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "run", ".", dir)
	cmd.Dir, cmd.Env = modDir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.Bytes())
	}
	out, err := DecodeObjects(&stdout)
	if err != nil {
		t.Fatalf("kustomize build %s: its output: %v", dir, err)
	}
	return out
}

// DecodeObjects returns the objects of a stream of YAML or JSON documents, in order; empty
// documents are left out.
func DecodeObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// repoRoot returns the repository's root: two folders above this file's.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		t.Fatal("testenv: cannot find the repository root from the source location")
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}
