package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// Shared is one etcd and one kube-apiserver serving every test of a package that asks for them,
// started on first use: starting them takes seconds, so a package keeps its tests apart by the
// names and ranges they use instead. Declare one per package and pass it to [Main] from TestMain,
// which closes it.
//
// The zero Shared starts a kube-apiserver with the zero [KubeAPIServerOptions]. A Shared is safe for
// concurrent use.
type Shared struct {
	// Options configures the kube-apiserver. Set it before the first call to
	// [Shared.KubeAPIServer].
	Options KubeAPIServerOptions

	once sync.Once
	etcd *localcluster.Etcd
	api  *KubeAPIServer
	err  error
}

// KubeAPIServer returns the shared kube-apiserver, starting it and its etcd (and building it, the
// first time on a machine) if needed. It skips t in -short mode and fails t if they do not start.
// A test starts its own deadlines after KubeAPIServer returns, so that neither the build nor the
// start-up counts against them.
func (s *Shared) KubeAPIServer(t testing.TB) *KubeAPIServer {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	s.once.Do(func() {
		opts, err := withBinary(s.Options)
		if err != nil {
			s.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		start := time.Now()
		if s.etcd, s.err = localcluster.StartEtcd(ctx, localcluster.EtcdOptions{UnsafeNoFsync: true}); s.err != nil {
			return
		}
		if s.api, s.err = localcluster.StartKubeAPIServer(ctx, s.etcd, opts); s.err == nil {
			fmt.Fprintf(os.Stderr, "%s ready in %v\n", describe(s.Options), time.Since(start).Round(time.Millisecond))
		}
	})
	if s.err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", s.err)
	}
	return s.api
}

// Etcd returns the etcd the shared kube-apiserver stores its state in, starting both as
// [Shared.KubeAPIServer] does; tests read and write the bitmaps there. It skips t in -short mode
// and fails t if they do not start.
func (s *Shared) Etcd(t testing.TB) *Etcd {
	t.Helper()
	s.KubeAPIServer(t)
	return &Etcd{s.etcd}
}

// Close stops the kube-apiserver and etcd if they were started, reporting failures on stderr.
func (s *Shared) Close() {
	if s.api != nil {
		if err := s.api.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close kube-apiserver:", err)
		}
	}
	if s.etcd != nil {
		if err := s.etcd.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close etcd:", err)
		}
	}
}
