package service_test

import (
	"net/netip"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/internal/servicematrix"
)

// The Service matrix lives in the module's testdata/services-<release>.yaml, one file per
// kube-apiserver release; testdata/README.md documents its schema and internal/servicematrix
// loads it. These names keep this package's tests short.

// matrixReleases are the releases with a matrix.
var matrixReleases = servicematrix.Releases

// matrixPathFor is the matrix file of release, relative to this package.
func matrixPathFor(release string) string {
	return servicematrix.PathFor(filepath.Join("..", "..", "testdata"), release)
}

type (
	matrixFile    = servicematrix.File
	matrixCluster = servicematrix.Cluster
	matrixSpec    = servicematrix.Spec
	matrixCase    = servicematrix.Case
	matrixExpect  = servicematrix.Expect
	matrixResult  = servicematrix.Result
	matrixText    = servicematrix.Text
)

func loadMatrix(t testing.TB, release string) *matrixFile {
	t.Helper()
	m, err := servicematrix.Load(matrixPathFor(release))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// clusterRanges parses a cluster's ranges; the primary family is the first range's.
func clusterRanges(t testing.TB, c matrixCluster) []netip.Prefix {
	t.Helper()
	out, err := c.Prefixes()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func matrixService(name string, s matrixSpec) *corev1.Service { return servicematrix.Service(name, s) }

func applySpec(svc *corev1.Service, s matrixSpec, created *corev1.Service) {
	servicematrix.Apply(svc, s, created)
}

// resultOf is servicematrix.ResultOf, failing t on an error that is not a StatusError and
// reporting the other problems it finds.
func resultOf(t testing.TB, tc matrixCase, ranges []netip.Prefix, svc, created *corev1.Service, err error) matrixResult {
	t.Helper()
	r, rerr := servicematrix.ResultOf(tc, ranges, svc, created, err)
	if rerr != nil {
		if err != nil {
			t.Fatal(rerr)
		}
		t.Error(rerr)
	}
	return r
}

// textOf is servicematrix.TextOf, failing t on an error that is not a StatusError.
func textOf(t testing.TB, tc matrixCase, ranges []netip.Prefix, created *corev1.Service, err error) *matrixText {
	t.Helper()
	txt, terr := servicematrix.TextOf(tc, ranges, created, err)
	if terr != nil {
		t.Fatal(terr)
	}
	return txt
}

func writeMatrix(m *matrixFile, release, source string) error {
	return servicematrix.Write(matrixPathFor(release), m, source)
}
