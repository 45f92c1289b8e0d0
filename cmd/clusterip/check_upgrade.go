package main

import (
	"context"
	"fmt"
	"io"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip/repair"
)

// leaseRole is the Role of deploy/rbac, in kube-system, that lets check and repair
// --remove-stale-bitmaps list the identity Leases of kube-apiserver.
const leaseRole = "clusterip-remove-stale-bitmaps"

// checkUpgrade makes the pre-flight of an upgrade to kube-apiserver 1.38 (repair.CheckUpgrade)
// from the identity Leases, the /version of each server (at the Leases' peer addresses, or at
// --apiserver-endpoints) and info, the /version of the server the kubeconfig reaches. It never
// fails: a user who may not list the Leases (the Role clusterip-remove-stale-bitmaps grants it)
// gets a note on stderr, and the pre-flight judges the endpoints named and the kubeconfig's
// server alone.
func (o *checkOptions) checkUpgrade(ctx context.Context, client kubernetes.Interface, restConfig *rest.Config, info *version.Info, stderr io.Writer) *repair.UpgradeCheck {
	var live []repair.APIServer
	if why := o.leasesUnreadable(ctx, client); why != "" {
		fmt.Fprintf(stderr, "clusterip: note: upgrade to %s: the identity Leases of kube-apiserver were not read (%s): the servers are not counted, and only --apiserver-endpoints and the kubeconfig's server are judged; bind the Role %s (deploy/rbac in the clusterip repository) with a RoleBinding in %s to count them\n",
			repair.UpgradeTarget, why, leaseRole, metav1.NamespaceSystem)
	} else {
		var err error
		if live, err = repair.LiveAPIServers(ctx, client); err != nil {
			live = nil
			fmt.Fprintf(stderr, "clusterip: note: upgrade to %s: the identity Leases of kube-apiserver were not read: %v; only --apiserver-endpoints and the kubeconfig's server are judged\n",
				repair.UpgradeTarget, apiError(restConfig.Host, err))
		}
	}
	versions, unread := repair.ReadEachServerVersion(ctx, restConfig, live, o.apiserverEndpoints)
	return repair.CheckUpgrade(repair.UpgradeEvidence{Live: live, Versions: versions, Unread: unread,
		Reached: &repair.ServerVersion{Endpoint: restConfig.Host, Info: *info}})
}

// leasesUnreadable asks the API server whether the kubeconfig's user may list the Leases of
// kube-system, so that a user without the Role is not refused (403) a list, and returns why not,
// or "" if it may, or if the server will not answer the review (the list then says).
func (o *checkOptions) leasesUnreadable(ctx context.Context, client kubernetes.Interface) string {
	review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: metav1.NamespaceSystem, Verb: "list", Group: coordinationv1.GroupName, Resource: "leases",
		}},
	}, metav1.CreateOptions{})
	if err != nil || review.Status.Allowed {
		return ""
	}
	return fmt.Sprintf("%s may not list leases.%s in %s", userName(ctx, client), coordinationv1.GroupName, metav1.NamespaceSystem)
}

// upgradeHazard reports whether rep's upgrade pre-flight found a 1.38 kube-apiserver live beside
// a bitmap writer, which check counts as a finding.
func upgradeHazard(rep *repair.Report) bool {
	return rep.Upgrade != nil && rep.Upgrade.Hazard != ""
}
