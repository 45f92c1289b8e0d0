package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	// Named cip: the tests of this package have a helper named clusterip.
	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/repair"
)

// bitmapWriters is what repair --remove-stale-bitmaps found about the cluster's kube-apiservers:
// the live ones, the versions read, and the refusal of repair.CheckBitmapWriters, if any.
type bitmapWriters struct {
	live     []repair.APIServer
	versions []repair.ServerVersion
	refusal  error // a *repair.BitmapWriterError, or nil: no server can write the bitmaps
}

// checkBitmapWriters lists the live kube-apiservers, reads their versions at their peer
// addresses (or at --apiserver-endpoints) with the kubeconfig's credentials and TLS settings, and
// judges them with repair.CheckBitmapWriters. A refusal is returned in the result; an error only
// when the servers could not be listed or read.
func (o *checkOptions) checkBitmapWriters(ctx context.Context, client kubernetes.Interface, restConfig *rest.Config) (*bitmapWriters, error) {
	live, err := repair.LiveAPIServers(ctx, client)
	if apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("missing RBAC permission at API server %s: %w; --remove-stale-bitmaps also needs list on leases.coordination.k8s.io in kube-system, to count the kube-apiservers by their identity Leases; bind the Role clusterip-remove-stale-bitmaps (deploy/rbac in the clusterip repository) with a RoleBinding in kube-system",
			restConfig.Host, err)
	}
	if err != nil {
		return nil, apiError(restConfig.Host, err)
	}
	versions, err := repair.ReadServerVersions(ctx, restConfig, live, o.apiserverEndpoints)
	if err != nil {
		return nil, err
	}
	return &bitmapWriters{live: live, versions: versions, refusal: repair.CheckBitmapWriters(live, versions)}, nil
}

// removeStaleBitmaps audits cfg's cluster, removes the stale bitmaps the audit reports at the
// revisions it read, and says on stderr which it removed and why it could. w must hold no refusal.
func removeStaleBitmaps(ctx context.Context, cfg cip.Config, w *bitmapWriters, stderr io.Writer) error {
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		return err
	}
	if len(rep.StaleBitmaps) == 0 {
		fmt.Fprintln(stderr, "clusterip: no stale bitmap to remove")
		return nil
	}
	removed, err := repair.RemoveStaleBitmaps(ctx, cfg, rep.StaleBitmaps)
	for _, b := range removed {
		fmt.Fprintf(stderr, "clusterip: removed the stale bitmap %s; %s\n", describeStaleBitmap(b), w.why())
	}
	return err
}

// dryRunStaleBitmaps says on stderr which stale bitmaps of rep repair would remove and why, or
// returns the refusal that would keep them.
func dryRunStaleBitmaps(rep *repair.Report, w *bitmapWriters, stderr io.Writer) error {
	if w.refusal != nil {
		for _, b := range rep.StaleBitmaps {
			fmt.Fprintf(stderr, "clusterip: dry run: repair would not remove the stale bitmap %s\n", describeStaleBitmap(b))
		}
		return w.refusal
	}
	if len(rep.StaleBitmaps) == 0 {
		fmt.Fprintln(stderr, "clusterip: dry run: there is no stale bitmap to remove")
	}
	for _, b := range rep.StaleBitmaps {
		fmt.Fprintf(stderr, "clusterip: dry run: repair would remove the stale bitmap %s; %s\n", describeStaleBitmap(b), w.why())
	}
	return nil
}

// why says why no kube-apiserver can write the bitmaps: how many live servers there are, and
// each version read, emulating 1.35 or later.
func (w *bitmapWriters) why() string {
	vs := make([]string, len(w.versions))
	for i, v := range w.versions {
		vs[i] = v.String()
	}
	return fmt.Sprintf("no kube-apiserver can write it: %s by identity Lease, each 1.35 or later: %s", count(len(w.live), "live kube-apiserver"), strings.Join(vs, ", "))
}

// describeStaleBitmap names b for a person: "/registry/ranges/serviceips (range 10.96.0.0/24,
// revision 5, 2 bits set)".
func describeStaleBitmap(b repair.StaleBitmap) string {
	return fmt.Sprintf("%s (range %s, revision %d, %s set)", b.Key, b.Range, b.Revision, count(b.Bits, "bit"))
}

// checkEndpoints returns an error naming the first of endpoints (--apiserver-endpoints) that is
// not an http or https URL of a server.
func checkEndpoints(endpoints []string) error {
	for _, e := range endpoints {
		u, err := url.Parse(e)
		if err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" && (u.Path == "" || u.Path == "/") && u.User == nil {
			continue
		}
		return fmt.Errorf("--apiserver-endpoints %q: want the URL of one kube-apiserver, such as https://10.0.0.2:6443", e)
	}
	return nil
}
