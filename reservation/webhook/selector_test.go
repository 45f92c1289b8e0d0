package webhook_test

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// webhookConfiguration returns the MutatingWebhookConfiguration clusterip-reservations with one
// webhook of ops on Services and the selectors given.
func webhookConfiguration(ops []admissionregistrationv1.OperationType, namespaces, objects *metav1.LabelSelector) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterip-reservations"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "services.reservations.clusterip.kube-ipam.io",
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: ops,
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}}}},
			NamespaceSelector: namespaces,
			ObjectSelector:    objects,
		}},
	}
}

// notKubeSystem is the shipped webhook's namespaceSelector.
var notKubeSystem = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
	{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{metav1.NamespaceSystem}}}}

// namespace returns the Namespace name with labels, and the label kube-apiserver gives each.
func namespace(name string, labels map[string]string) *corev1.Namespace {
	l := map[string]string{corev1.LabelMetadataName: name}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func TestSentSelectsWhatTheWebhookConfigurationSends(t *testing.T) {
	create := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	teamA := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	optIn := &metav1.LabelSelector{MatchLabels: map[string]string{"reservations": "on"}}
	tests := []struct {
		name      string
		config    runtime.Object // nil for none
		namespace string
		labels    map[string]string // the Service's
		want      bool
	}{
		{"the shipped selector sends default", webhookConfiguration(create, notKubeSystem, nil), "default", nil, true},
		{"the shipped selector leaves out kube-system", webhookConfiguration(create, notKubeSystem, nil), "kube-system", nil, false},
		{"a namespace deleted meanwhile still has its name label", webhookConfiguration(create, notKubeSystem, nil), "gone", nil, true},
		{"no configuration sends nothing", nil, "default", nil, false},
		{"a namespace labelled as the selector asks", webhookConfiguration(create, teamA, nil), "a", nil, true},
		{"a namespace without the label", webhookConfiguration(create, teamA, nil), "default", nil, false},
		{"a Service the objectSelector selects", webhookConfiguration(create, nil, optIn), "default", map[string]string{"reservations": "on"}, true},
		{"a Service the objectSelector leaves out", webhookConfiguration(create, nil, optIn), "default", nil, false},
		{"rules without CREATE send no create", webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}, nil, nil), "default", nil, false},
		{"rules of all operations", webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll}, nil, nil), "default", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []runtime.Object{namespace("default", nil), namespace("kube-system", nil), namespace("a", map[string]string{"team": "a"})}
			if tt.config != nil {
				objs = append(objs, tt.config)
			}
			fake := fakeclient.New(fakeclient.Options{Objects: objs})
			factory := informers.NewSharedInformerFactory(fake, 0)
			sent, err := webhook.NewSent(factory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), "clusterip-reservations")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			factory.Start(ctx.Done())
			defer func() { cancel(); factory.Shutdown() }()
			factory.WaitForCacheSync(ctx.Done())
			if !sent.HasSynced() {
				t.Fatal("HasSynced() = false after the informers synced")
			}
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: tt.namespace, Name: "web", Labels: tt.labels}}
			got, err := sent.Selects(svc)
			if err != nil || got != tt.want {
				t.Errorf("Selects(%s/web, labels %v) = %v, %v; want %v, nil", tt.namespace, tt.labels, got, err, tt.want)
			}
		})
	}
	if _, err := webhook.NewSent(nil, nil, ""); err == nil {
		t.Error("NewSent(nil, nil, \"\") = nil error, want one")
	}
}

// TestControllerKeepsNothingForAServiceTheWebhookIsNotSent deletes a Retain Service in
// kube-system, which the shipped webhook configuration leaves out, and one in default: only the
// second's address is kept, since only its create would get it back.
func TestControllerKeepsNothingForAServiceTheWebhookIsNotSent(t *testing.T) {
	inSystem := testenv.ClusterIPService("dns", "10.96.0.10")
	inSystem.Namespace = metav1.NamespaceSystem
	inDefault := testenv.ClusterIPService("web", "10.96.0.20")
	for _, svc := range []*corev1.Service{inSystem, inDefault} {
		svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
		svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
	}
	inDefaultNS := namespace("default", nil)
	inDefaultNS.Annotations = map[string]string{reservation.AnnotationMaxRetained: "10"}
	fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{inSystem, inDefault, inDefaultNS, namespace("kube-system", nil),
		webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, notKubeSystem, nil)}})
	factory := informers.NewSharedInformerFactory(fake, 0)
	sent, err := webhook.NewSent(factory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), "clusterip-reservations")
	if err != nil {
		t.Fatal(err)
	}
	c, err := webhook.NewController(fake, factory.Core().V1().Services(), webhook.ControllerOptions{Sent: sent, ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond,
		Limits: limitsOf(t, factory, false)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, factory, c)
	fake.WaitWatching(t, "services")
	factory.WaitForCacheSync(ctx.Done())
	// kube-system's first: once default's is kept, the worker has judged both.
	for _, svc := range []*corev1.Service{inSystem, inDefault} {
		if err := fake.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if r := waitForReservation(t, ctx, fake, "10.96.0.20"); r.For.String() != "default/web" {
		t.Errorf("the reservation at 10.96.0.20 is kept for %s, want default/web", r.For)
	}
	if obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.10", metav1.GetOptions{}); err == nil {
		t.Errorf("kube-system/dns's address was kept: %+v", obj)
	}
}
