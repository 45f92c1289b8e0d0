package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// certManagerModule is the cert-manager release whose CustomResourceDefinitions the cert-manager
// overlay is applied against: the module's deploy/crds folder, plain YAML (the Helm chart's
// templates/crd-*.yaml are the same objects inside template lines, and not used).
const certManagerModule = "github.com/cert-manager/cert-manager@v1.21.2"

// shippedImage is the image of the release, without its tag, that every workload of deploy/ runs.
const shippedImage = "ghcr.io/kube-ipam/clusterip"

// certManagerCRDs returns the CustomResourceDefinitions of certManagerModule, from the module's
// files: "go mod download" (the module proxy, or the module cache when it has them) outside any
// module, verified against the checksum database as every module download is.
func certManagerCRDs(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", certManagerModule)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s%s", certManagerModule, err, out, stderr.Bytes())
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s: %s: %v", certManagerModule, out, err)
	}
	files, err := filepath.Glob(filepath.Join(mod.Dir, "deploy", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no deploy/crds/*.yaml: %v", certManagerModule, err)
	}
	var crds []*unstructured.Unstructured
	for _, f := range files {
		for _, obj := range manifestObjects(t, f) {
			if obj.GetKind() != "CustomResourceDefinition" {
				t.Fatalf("%s: a %s in %s", certManagerModule, obj.GetKind(), filepath.Base(f))
			}
			crds = append(crds, obj)
		}
	}
	return crds
}

// installCRDs creates crds with client and waits until each is Established.
func installCRDs(t *testing.T, client dynamic.Interface, crds []*unstructured.Unstructured) {
	t.Helper()
	res := client.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, crd := range crds {
		if _, err := res.Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CustomResourceDefinition %s: %v", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		testenv.WaitFor(t, "CustomResourceDefinition "+crd.GetName()+" to be established", func() bool {
			got, err := res.Get(t.Context(), crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				c, _ := c.(map[string]any)
				if c["type"] == "Established" && c["status"] == "True" {
					return true
				}
			}
			return false
		})
	}
}

// renderedObjects are the objects of one kustomization, with typed views of those the checks read.
type renderedObjects []*unstructured.Unstructured

// of returns the objects of kind.
func (r renderedObjects) of(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one converts the only object of kind into into, failing t unless there is exactly one.
func (r renderedObjects) one(t *testing.T, kind string, into any) {
	t.Helper()
	objs := r.of(kind)
	if len(objs) != 1 {
		t.Fatalf("%d objects of kind %s, want one", len(objs), kind)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(objs[0].Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", kind, objs[0].GetName(), err)
	}
}

// checkRestrictedContainer checks what every container of deploy/ must be: the release image,
// user 65532, and resource requests.
func checkRestrictedContainer(t *testing.T, what string, c corev1.Container) {
	t.Helper()
	if name, tag, _ := strings.Cut(c.Image, ":"); name != shippedImage || tag == "" {
		t.Errorf("%s: image %q, want %s:<the release>", what, c.Image, shippedImage)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: securityContext %+v, want runAsNonRoot as user 65532", what, c.SecurityContext)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: requests %v, want CPU and memory", what, c.Resources.Requests)
	}
}

// checkWebhookBase checks the rendered webhook of deploy/webhook and its overlays: two replicas
// that a PodDisruptionBudget keeps one of, the probes at /healthz and /readyz, and both webhooks
// calling the Service. It returns the Deployment.
func checkWebhookBase(t *testing.T, objs renderedObjects) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	objs.one(t, "Deployment", &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("Deployment %s: replicas %v, want 2", d.Name, d.Spec.Replicas)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s: %d containers, want one", d.Name, len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	checkRestrictedContainer(t, "Deployment "+d.Name, c)
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path {
			t.Errorf("Deployment %s: a probe %+v, want an HTTP GET of %s", d.Name, p.probe, p.path)
		}
	}
	var pdb policyv1.PodDisruptionBudget
	objs.one(t, "PodDisruptionBudget", &pdb)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.Selector == nil || !maps.Equal(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget %s: minAvailable %v of %v, want 1 of the webhook's Pods %v", pdb.Name, pdb.Spec.MinAvailable, pdb.Spec.Selector, d.Spec.Template.Labels)
	}
	var svc corev1.Service
	objs.one(t, "Service", &svc)
	var hooks admissionregistrationv1.MutatingWebhookConfiguration
	objs.one(t, "MutatingWebhookConfiguration", &hooks)
	if len(hooks.Webhooks) != 3 {
		t.Errorf("MutatingWebhookConfiguration %s: %d webhooks, want 3 (Services, the IPAddress guard, the release guard)", hooks.Name, len(hooks.Webhooks))
	}
	for _, h := range hooks.Webhooks {
		if ref := h.ClientConfig.Service; ref == nil || ref.Name != svc.Name || ref.Namespace != svc.Namespace {
			t.Errorf("webhook %s calls %+v, want the Service %s/%s", h.Name, h.ClientConfig.Service, svc.Namespace, svc.Name)
		}
	}
	return &d
}

// TestShippedKustomizationsApplyToStockKubeAPIServer renders every kustomization of deploy/
// (testenv.Kustomize: the kustomize library, as kubectl apply -k does) and applies each object,
// server-side with dryRun=All, to a real stock kube-apiserver v1.37.2 whose kube-system warns of
// Pods below the restricted Pod Security Standard, with cert-manager's CustomResourceDefinitions
// installed first (certManagerModule's files): each object is valid, and none is warned of. It
// checks what each kustomization is for: the webhook's 2 replicas, PodDisruptionBudget, probes,
// requests and user 65532; the cert-manager overlay's self-signed CA chain, the serving
// Certificate for the Service's DNS names written to the Secret the Deployment mounts, and CA
// injection from it; the managed-cluster example's NetworkPolicy and its webhook without a client
// CA; a ServiceAccount bound to every role of deploy/rbac; and the CronJob that runs check
// read-only.
func TestShippedKustomizationsApplyToStockKubeAPIServer(t *testing.T) {
	t.Parallel()
	start := time.Now()
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", AuthorizationMode: "RBAC"})
	ctx := t.Context()
	dyn, warnings := warnedDynamicClient(t, api)
	installCRDs(t, dyn, certManagerCRDs(t))
	groups, err := restmapper.GetAPIGroupResources(api.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	t.Logf("kube-apiserver v1.37.2 with cert-manager's CRDs in %v", time.Since(start).Round(time.Millisecond))

	// rbacRoles are the roles of deploy/rbac, as kind/name, once its case has run.
	var rbacRoles []string
	tests := []struct {
		dir   string
		check func(t *testing.T, objs renderedObjects)
	}{
		{"deploy/rbac", func(t *testing.T, objs renderedObjects) {
			files, err := filepath.Glob(filepath.Join(rbacDir, "*.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != len(files)-1 { // all but kustomization.yaml
				t.Errorf("%d roles, want one per file of %s (%d)", len(objs), rbacDir, len(files)-1)
			}
			for _, o := range objs {
				rbacRoles = append(rbacRoles, o.GetKind()+"/"+o.GetName())
			}
		}},
		{"deploy/accounts", func(t *testing.T, objs renderedObjects) {
			bound := map[string]bool{}
			accounts := map[string]bool{}
			for _, o := range objs.of("ServiceAccount") {
				accounts[o.GetNamespace()+"/"+o.GetName()] = true
			}
			for _, o := range slices.Concat(objs.of("ClusterRoleBinding"), objs.of("RoleBinding")) {
				var b rbacv1.RoleBinding // a ClusterRoleBinding's fields
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
					t.Fatal(err)
				}
				bound[b.RoleRef.Kind+"/"+b.RoleRef.Name] = true
				for _, s := range b.Subjects {
					if s.Kind != rbacv1.ServiceAccountKind || !accounts[s.Namespace+"/"+s.Name] {
						t.Errorf("%s %s binds %s %s/%s, want a ServiceAccount of deploy/accounts", o.GetKind(), o.GetName(), s.Kind, s.Namespace, s.Name)
					}
				}
			}
			for _, r := range rbacRoles {
				if !bound[r] {
					t.Errorf("no ServiceAccount is bound to %s of deploy/rbac", r)
				}
			}
		}},
		{"deploy/accounts/check", nil},
		{"deploy/accounts/repair", nil},
		{"deploy/accounts/reservations", nil},
		{"deploy/accounts/registry", nil},
		{"deploy/accounts/servicecidr-lifecycle", nil},
		{"deploy/webhook", func(t *testing.T, objs renderedObjects) {
			d := checkWebhookBase(t, objs)
			if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--client-ca-file=/etc/webhook/client-ca/ca.crt") {
				t.Errorf("Deployment %s: args %q, want --client-ca-file", d.Name, d.Spec.Template.Spec.Containers[0].Args)
			}
		}},
		{"deploy/webhook-cert-manager", func(t *testing.T, objs renderedObjects) {
			d := checkWebhookBase(t, objs)
			var svc corev1.Service
			objs.one(t, "Service", &svc)
			var hooks admissionregistrationv1.MutatingWebhookConfiguration
			objs.one(t, "MutatingWebhookConfiguration", &hooks)
			inject := hooks.Annotations["cert-manager.io/inject-ca-from"]
			ns, name, _ := strings.Cut(inject, "/")
			var serving *unstructured.Unstructured
			for _, c := range objs.of("Certificate") {
				if c.GetNamespace() == ns && c.GetName() == name {
					serving = c
				}
			}
			if serving == nil {
				t.Fatalf("MutatingWebhookConfiguration %s: cert-manager.io/inject-ca-from %q, want a Certificate of the overlay", hooks.Name, inject)
			}
			secret, _, _ := unstructured.NestedString(serving.Object, "spec", "secretName")
			dnsNames, _, _ := unstructured.NestedStringSlice(serving.Object, "spec", "dnsNames")
			if want := svc.Name + "." + svc.Namespace + ".svc"; !slices.Contains(dnsNames, want) {
				t.Errorf("Certificate %s: dnsNames %q, want %s", name, dnsNames, want)
			}
			var mounted bool
			for _, v := range d.Spec.Template.Spec.Volumes {
				mounted = mounted || (v.Secret != nil && v.Secret.SecretName == secret)
			}
			if !mounted || serving.GetNamespace() != d.Namespace {
				t.Errorf("the Deployment %s/%s mounts %+v, want the Certificate's Secret %s/%s", d.Namespace, d.Name, d.Spec.Template.Spec.Volumes, serving.GetNamespace(), secret)
			}
			// The chain: the serving Certificate's Issuer signs with a CA Certificate's Secret,
			// which a self-signed Issuer issues.
			issuers := map[string]*unstructured.Unstructured{}
			for _, i := range objs.of("Issuer") {
				issuers[i.GetName()] = i
			}
			issuerOf := func(c *unstructured.Unstructured) *unstructured.Unstructured {
				n, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "name")
				return issuers[n]
			}
			caSecret, _, _ := unstructured.NestedString(issuerOf(serving).Object, "spec", "ca", "secretName")
			var chained bool
			for _, c := range objs.of("Certificate") {
				isCA, _, _ := unstructured.NestedBool(c.Object, "spec", "isCA")
				s, _, _ := unstructured.NestedString(c.Object, "spec", "secretName")
				if i := issuerOf(c); isCA && s == caSecret && i != nil {
					_, chained, _ = unstructured.NestedMap(i.Object, "spec", "selfSigned")
				}
			}
			if !chained {
				t.Errorf("the serving Certificate %s is not issued by a CA Issuer whose CA Certificate a self-signed Issuer issues", name)
			}
		}},
		{"deploy/examples/managed-cluster", func(t *testing.T, objs renderedObjects) {
			d := checkWebhookBase(t, objs)
			var np networkingv1.NetworkPolicy
			objs.one(t, "NetworkPolicy", &np)
			if !maps.Equal(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) || np.Namespace != d.Namespace {
				t.Errorf("NetworkPolicy %s/%s selects %v, want the webhook's Pods %s %v", np.Namespace, np.Name, np.Spec.PodSelector.MatchLabels, d.Namespace, d.Spec.Template.Labels)
			}
			for _, in := range np.Spec.Ingress {
				for _, from := range in.From {
					if b := from.IPBlock; b != nil {
						if _, err := netip.ParsePrefix(b.CIDR); err != nil {
							t.Errorf("NetworkPolicy %s: ipBlock %q: %v", np.Name, b.CIDR, err)
						}
					}
				}
			}
			if len(objs.of("ConfigMap")) != 0 {
				t.Errorf("the ConfigMap of the control plane's addresses is in the output: want it local-config")
			}
			c := d.Spec.Template.Spec.Containers[0]
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--client-ca-file") {
					t.Errorf("Deployment %s: %s, want no client CA where kube-apiserver presents no certificate", d.Name, a)
				}
			}
			if len(c.VolumeMounts) != 1 || len(d.Spec.Template.Spec.Volumes) != 1 {
				t.Errorf("Deployment %s: volumes %+v, want the serving certificate's alone", d.Name, d.Spec.Template.Spec.Volumes)
			}
		}},
		{"deploy/examples/check-cronjob", func(t *testing.T, objs renderedObjects) {
			var cj batchv1.CronJob
			objs.one(t, "CronJob", &cj)
			pod := cj.Spec.JobTemplate.Spec.Template.Spec
			if len(pod.Containers) != 1 || len(pod.Containers[0].Args) == 0 || pod.Containers[0].Args[0] != "check" || len(pod.Containers[0].Command) != 0 {
				t.Fatalf("CronJob %s: containers %+v, want one running the image's entrypoint with args check …", cj.Name, pod.Containers)
			}
			checkRestrictedContainer(t, "CronJob "+cj.Name, pod.Containers[0])
			// Read-only: every role bound to the Job's ServiceAccount grants reading verbs only.
			roles := map[string][]rbacv1.PolicyRule{}
			for _, o := range slices.Concat(objs.of("ClusterRole"), objs.of("Role")) {
				var r rbacv1.Role
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
					t.Fatal(err)
				}
				roles[o.GetKind()+"/"+o.GetName()] = r.Rules
			}
			var bindings int
			for _, o := range slices.Concat(objs.of("ClusterRoleBinding"), objs.of("RoleBinding")) {
				var b rbacv1.RoleBinding
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
					return s.Kind == rbacv1.ServiceAccountKind && s.Name == pod.ServiceAccountName && s.Namespace == cj.Namespace
				}) {
					continue
				}
				bindings++
				rules, ok := roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]
				if !ok {
					t.Errorf("%s %s binds %s %s, which the example does not hold", o.GetKind(), o.GetName(), b.RoleRef.Kind, b.RoleRef.Name)
				}
				for _, r := range rules {
					for _, v := range r.Verbs {
						if v != "get" && v != "list" && v != "watch" {
							t.Errorf("%s %s grants %s on %v to the CronJob's ServiceAccount %s: want reading only", b.RoleRef.Kind, b.RoleRef.Name, v, r.Resources, pod.ServiceAccountName)
						}
					}
				}
			}
			if bindings == 0 {
				t.Errorf("no binding of the CronJob's ServiceAccount %s/%s", cj.Namespace, pod.ServiceAccountName)
			}
		}},
	}

	// Every kustomization of deploy/ is in tests (components are rendered by those that use them).
	var found []string
	root := filepath.Join(rbacDir, "..", "..")
	err = filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "kustomization.yaml" {
			return err
		}
		if k := manifestObjects(t, path); len(k) == 1 && k[0].GetKind() == "Component" {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		found = append(found, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, tt := range tests {
		listed = append(listed, tt.dir)
	}
	if slices.Sort(found); !slices.Equal(found, slices.Sorted(slices.Values(listed))) {
		t.Errorf("the kustomizations of deploy/ are %q, the test renders %q", found, listed)
	}

	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			renderStart := time.Now()
			objs := renderedObjects(testenv.Kustomize(t, tt.dir))
			render := time.Since(renderStart)
			if len(objs) == 0 {
				t.Fatal("no objects")
			}
			applyStart := time.Now()
			for _, obj := range objs {
				gvk := obj.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Errorf("%s %s: %v", gvk.Kind, obj.GetName(), err)
					continue
				}
				var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
				if m.Scope.Name() == meta.RESTScopeNameNamespace {
					ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
				}
				if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "clusterip-deploy-test", DryRun: []string{metav1.DryRunAll}}); err != nil {
					t.Errorf("server-side apply (dry run) of %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
				}
				if w := warnings.take(); len(w) > 0 {
					t.Errorf("the API server warned of %s %s/%s: %q", gvk.Kind, obj.GetNamespace(), obj.GetName(), w)
				}
			}
			t.Logf("%d objects: rendered in %v, applied (dry run) in %v", len(objs), render.Round(time.Millisecond), time.Since(applyStart).Round(time.Millisecond))
			if tt.check != nil {
				tt.check(t, objs)
			}
		})
	}
	// A dry run stores nothing.
	if _, err := api.Client.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "clusterip-reservations-webhook", metav1.GetOptions{}); err == nil {
		t.Error("the webhook's Deployment exists after dry runs only")
	}
	t.Logf("the whole test in %v", time.Since(start).Round(time.Millisecond))
}
