package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/featuregate"
)

// The ClusterRoles of deploy/rbac that grant what check needs, and what repair needs besides.
const (
	checkRole       = "clusterip-check"
	checkRepairRole = "clusterip-check-repair"
)

// permission is a verb on a resource of an API group, as RBAC grants it.
type permission struct {
	verb, group, resource string
	role                  string // the ClusterRole of deploy/rbac that grants it
}

// resourceName returns the resource as kubectl names it: "services",
// "ipaddresses.networking.k8s.io".
func (p permission) resourceName() string {
	if p.group == "" {
		return p.resource
	}
	return p.resource + "." + p.group
}

// neededPermissions returns what check needs of the API server to audit in mode, and with repair
// what repair needs to write too; withEtcd says whether the Service CIDRs are read from etcd
// (else from the ServiceCIDR "kubernetes"). Legacy mode keeps its allocations in etcd alone: it
// reads Services only, and repairs only bitmaps.
func neededPermissions(mode featuregate.Mode, repair, withEtcd bool) []permission {
	const nw = "networking.k8s.io"
	ps := []permission{
		{"list", "", "services", checkRole},
		{"get", "", "services", checkRole},
	}
	if mode == featuregate.Legacy {
		return ps
	}
	ps = append(ps,
		permission{"list", nw, "servicecidrs", checkRole},
		permission{"list", nw, "ipaddresses", checkRole},
		permission{"get", nw, "ipaddresses", checkRole},
		permission{"list", "", "namespaces", checkRole}, // reservations kept for a namespace that is gone
	)
	if !withEtcd {
		ps = append(ps, permission{"get", nw, "servicecidrs", checkRole})
	}
	if repair {
		ps = append(ps,
			permission{"create", nw, "ipaddresses", checkRepairRole},
			permission{"update", nw, "ipaddresses", checkRepairRole},
			permission{"delete", nw, "ipaddresses", checkRepairRole},
		)
	}
	return ps
}

// checkAccess asks the API server, before check reads or writes anything, whether the kubeconfig's
// user has every permission in need, with a SelfSubjectAccessReview each, and returns one error
// naming the user, every permission it lacks and the ClusterRoles that grant them. A server that
// will not answer the reviews (it refuses them, or does not serve them) is not judged here: the
// calls themselves then say what they lack. Reviews store nothing.
func checkAccess(ctx context.Context, client kubernetes.Interface, host, what string, need []permission) error {
	var missing []permission
	for _, p := range need {
		review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: p.verb, Group: p.group, Resource: p.resource,
			}},
		}, metav1.CreateOptions{})
		switch {
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err):
			return nil
		case err != nil:
			return apiError(host, err)
		case !review.Status.Allowed:
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("missing RBAC permission at API server %s: %s may not %s, which %s needs; bind the %s (deploy/rbac in the clusterip repository)",
		host, userName(ctx, client), describeMissing(missing), what, rolesOf(missing))
}

// userName returns who the API server takes the kubeconfig's credentials for, as `user "name"`,
// or "the kubeconfig's user" if it does not say (SelfSubjectReview is GA since 1.28).
func userName(ctx context.Context, client kubernetes.Interface) string {
	r, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || r.Status.UserInfo.Username == "" {
		return "the kubeconfig's user"
	}
	return fmt.Sprintf("user %q", r.Status.UserInfo.Username)
}

// describeMissing lists permissions by resource, in the order given: "list, get services and get
// ipaddresses.networking.k8s.io".
func describeMissing(ps []permission) string {
	var resources []string
	verbs := map[string][]string{}
	for _, p := range ps {
		r := p.resourceName()
		if _, ok := verbs[r]; !ok {
			resources = append(resources, r)
		}
		verbs[r] = append(verbs[r], p.verb)
	}
	parts := make([]string, len(resources))
	for i, r := range resources {
		parts[i] = strings.Join(verbs[r], ", ") + " " + r
	}
	return strings.Join(parts, " and ")
}

// rolesOf names the ClusterRoles that grant ps: "ClusterRole clusterip-check", or "ClusterRoles
// clusterip-check and clusterip-check-repair".
func rolesOf(ps []permission) string {
	var roles []string
	for _, p := range ps {
		if !slices.Contains(roles, p.role) {
			roles = append(roles, p.role)
		}
	}
	if len(roles) == 1 {
		return "ClusterRole " + roles[0]
	}
	return "ClusterRoles " + strings.Join(roles, " and ")
}
