package webhook

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	admissionregistrationv1informers "k8s.io/client-go/informers/admissionregistration/v1"
	corev1informers "k8s.io/client-go/informers/core/v1"
	admissionregistrationv1listers "k8s.io/client-go/listers/admissionregistration/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// Sent decides which Services kube-apiserver sends to the [Handler]: those a webhook of the
// MutatingWebhookConfiguration that registers it selects, by its namespaceSelector (on the
// Service's Namespace's labels) and its objectSelector (on the Service's). The [Controller] keeps
// addresses only for deleted Services it selects, so that no address is kept for a name whose
// create the webhook never sees, and the configuration is the one place that decides both.
//
// The zero Sent is not usable; use [NewSent]. A Sent is safe for concurrent use.
type Sent struct {
	config     string
	configs    admissionregistrationv1listers.MutatingWebhookConfigurationLister
	namespaces corev1listers.NamespaceLister
	synced     []cache.InformerSynced
}

// NewSent returns a Sent that reads the MutatingWebhookConfiguration named config from configs
// and Namespaces' labels from namespaces, informers the caller starts (configs may list that one
// object alone, with a metadata.name field selector). An empty name or a nil informer is an error
// matching allocator.ErrInvalid.
func NewSent(configs admissionregistrationv1informers.MutatingWebhookConfigurationInformer, namespaces corev1informers.NamespaceInformer, config string) (*Sent, error) {
	if config == "" || configs == nil || namespaces == nil {
		return nil, fmt.Errorf("webhook: NewSent needs a configuration's name and MutatingWebhookConfiguration and Namespace informers: %w", allocator.ErrInvalid)
	}
	return &Sent{
		config:     config,
		configs:    configs.Lister(),
		namespaces: namespaces.Lister(),
		synced:     []cache.InformerSynced{configs.Informer().HasSynced, namespaces.Informer().HasSynced},
	}, nil
}

// HasSynced reports whether both informers have synced.
func (s *Sent) HasSynced() bool {
	for _, synced := range s.synced {
		if !synced() {
			return false
		}
	}
	return true
}

// Selects reports whether kube-apiserver sends svc's create to the webhook, by the selectors of
// the configuration as the informers hold it now: false when the configuration does not exist
// (it sends nothing) or a selector does not parse (kube-apiserver refuses such a configuration).
// A Namespace the informer does not hold (deleted meanwhile) has the one label kube-apiserver
// gives every Namespace, kubernetes.io/metadata.name.
func (s *Sent) Selects(svc *corev1.Service) (bool, error) {
	cfg, err := s.configs.Get(s.config)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("webhook: read MutatingWebhookConfiguration %s: %w", s.config, err)
	}
	nsLabels := labels.Set{corev1.LabelMetadataName: svc.Namespace}
	if ns, err := s.namespaces.Get(svc.Namespace); err == nil {
		nsLabels = ns.Labels
	}
	for _, h := range cfg.Webhooks {
		if !coversServiceCreates(h.Rules) {
			continue
		}
		ok, err := matches(h.NamespaceSelector, nsLabels)
		if err != nil || !ok {
			continue
		}
		if ok, err := matches(h.ObjectSelector, svc.Labels); err == nil && ok {
			return true, nil
		}
	}
	return false, nil
}

// matches reports whether sel selects set; a nil selector selects everything, as in a webhook.
func matches(sel *metav1.LabelSelector, set labels.Set) (bool, error) {
	if sel == nil {
		return true, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(set), nil
}

// coversServiceCreates reports whether rules send the create of a core v1 Service.
func coversServiceCreates(rules []admissionregistrationv1.RuleWithOperations) bool {
	return covers(rules, admissionregistrationv1.Create, "", "services")
}

// covers reports whether rules send an op of a v1 resource of group.
func covers(rules []admissionregistrationv1.RuleWithOperations, op admissionregistrationv1.OperationType, group, resource string) bool {
	has := func(list []string, v string) bool {
		for _, x := range list {
			if x == v || x == "*" {
				return true
			}
		}
		return false
	}
	for _, r := range rules {
		ops := false
		for _, o := range r.Operations {
			if o == op || o == admissionregistrationv1.OperationAll {
				ops = true
			}
		}
		if ops && has(r.APIGroups, group) && has(r.APIVersions, "v1") && (has(r.Resources, resource) || has(r.Resources, "*/*")) {
			return true
		}
	}
	return false
}

// GuardsReleases reports whether the configuration, as the informer holds it now, sends
// kube-apiserver's deletes of reservations of both families to the webhook and fails them when
// the webhook does not answer (failurePolicy Fail), so that the [Handler] refuses kube-apiserver's
// release of an allocation kept in place (HandlerOptions.Services), and a webhook that is down
// makes the release fail rather than free the address. The [Controller] keeps a Retain Service's
// addresses in place only then; otherwise it makes the reservations after kube-apiserver's
// release, with a window.
func (s *Sent) GuardsReleases() bool {
	cfg, err := s.configs.Get(s.config)
	if err != nil {
		return false
	}
	for _, fam := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		set := labels.Set{networkingv1.LabelManagedBy: reservation.ManagedBy, networkingv1.LabelIPAddressFamily: string(fam)}
		guarded := false
		for _, h := range cfg.Webhooks {
			if h.FailurePolicy == nil || *h.FailurePolicy != admissionregistrationv1.Fail || !covers(h.Rules, admissionregistrationv1.Delete, networkingv1.GroupName, "ipaddresses") {
				continue
			}
			if ok, err := matches(h.ObjectSelector, set); err == nil && ok {
				guarded = true
				break
			}
		}
		if !guarded {
			return false
		}
	}
	return true
}
