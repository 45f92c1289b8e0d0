package testenv

import (
	"context"
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
