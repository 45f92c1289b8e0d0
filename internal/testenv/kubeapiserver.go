package testenv

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// KubeAPIServer is a kube-apiserver started for a test; see [localcluster.KubeAPIServer].
type KubeAPIServer = localcluster.KubeAPIServer

// KubeAPIServerOptions configures [NewKubeAPIServer] and [Shared]; see
// [localcluster.KubeAPIServerOptions].
type KubeAPIServerOptions = localcluster.KubeAPIServerOptions

// KubeAPIServerVersion is the version of the kube-apiserver the tests run.
const KubeAPIServerVersion = localcluster.KubeAPIServerVersion

// startTimeout bounds how long the test helpers wait for etcd, and for a kube-apiserver whose
// binary exists, to start; it never covers a build.
const startTimeout = 2 * time.Minute

// withBinary returns opts with Binary set, building kube-apiserver opts.Release if needed. The build is bounded
// only by the test binary's -timeout (and [Main] builds before that starts), never by a deadline
// of its own: it takes minutes on a new machine.
func withBinary(opts KubeAPIServerOptions) (KubeAPIServerOptions, error) {
	if opts.Binary != "" {
		return opts, nil
	}
	bin, err := localcluster.KubeAPIServerReleaseBinary(context.Background(), opts.Release)
	opts.Binary = bin
	return opts, err
}

// describe names the kube-apiserver opts start in log lines: its binary if the caller chose
// one, else its release.
func describe(opts KubeAPIServerOptions) string {
	switch {
	case opts.Binary != "":
		return "kube-apiserver " + opts.Binary
	case opts.Release != "":
		return "kube-apiserver " + opts.Release
	}
	return "kube-apiserver " + KubeAPIServerVersion
}

// NewKubeAPIServer starts a kube-apiserver against etcd for the test t and closes it when t
// finishes; if t failed, the end of the server's log goes to the test log. It skips t when
// testing.Short() is set, and fails t on any error otherwise, so these tests never skip silently.
// It may build the binary first (see [localcluster.KubeAPIServerBinary]); the build has no
// deadline of its own, and t starts its own deadlines after NewKubeAPIServer returns.
func NewKubeAPIServer(t testing.TB, etcd *Etcd, opts KubeAPIServerOptions) *KubeAPIServer {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	what := describe(opts)
	opts, err := withBinary(opts)
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	start := time.Now()
	s, err := localcluster.StartKubeAPIServer(ctx, etcd.Etcd, opts)
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Logf("%s ready in %v at %s", what, time.Since(start).Round(time.Millisecond), s.Config.Host)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- end of %s:\n%s", s.LogPath, s.LogTail(100))
		}
		if err := s.Close(); err != nil {
			t.Errorf("close kube-apiserver: %v", err)
		}
	})
	return s
}

// builtReleases are the releases whose stock kube-apiserver the tests build when it is missing
// (CI builds both before the tests); the tests of the other releases run where a build is at hand.
var builtReleases = []string{KubeAPIServerVersion, "v1.37.2"}

// StockKubeAPIServer returns the stock kube-apiserver binary of release and whether there is
// one: the binary the environment names (localcluster.KubeAPIServerReleaseEnv), else the build of
// a release the tests build (made if missing), else the cached build of
// "go run ./internal/localcluster/cmd/build-kube-apiserver -release <release>" if there is one.
// A test skips a release without one and says how to build it (SkipWithoutStock).
func StockKubeAPIServer(t testing.TB, release string) (string, bool) {
	t.Helper()
	_, named := os.LookupEnv(localcluster.KubeAPIServerReleaseEnv(release))
	if !named && !slices.Contains(builtReleases, release) {
		bin, err := localcluster.CachedKubeAPIServerReleaseBinary(release)
		if errors.Is(err, os.ErrNotExist) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return bin, true
	}
	bin, err := localcluster.KubeAPIServerReleaseBinary(context.Background(), release)
	if err != nil {
		t.Fatal(err)
	}
	return bin, true
}

// SkipWithoutStock returns StockKubeAPIServer's binary of release, and skips t, saying how to
// build one, when there is none.
func SkipWithoutStock(t testing.TB, release string) string {
	t.Helper()
	bin, ok := StockKubeAPIServer(t, release)
	if !ok {
		t.Skipf("no stock kube-apiserver %s: build it with go run ./internal/localcluster/cmd/build-kube-apiserver -release %s, or set $%s",
			release, release, localcluster.KubeAPIServerReleaseEnv(release))
	}
	return bin
}
