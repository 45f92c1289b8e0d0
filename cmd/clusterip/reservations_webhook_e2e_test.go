package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// webhookManifest is the manifest of the reservations webhook, relative to rbacDir: the file of
// its ClusterRole and Role.
const webhookManifest = "../webhook/webhook.yaml"

// webhookKustomization is the kustomize base of the reservations webhook, relative to the
// repository root, which the tests render (testenv.Kustomize) and apply as shipped.
const webhookKustomization = "deploy/webhook"

// managedClusterExample is the example overlay, relative to the repository root, of a cluster
// whose kube-apiserver presents no client certificate: the base with the NetworkPolicy component.
const managedClusterExample = "deploy/examples/managed-cluster"

// manifestObjects returns the objects of the multi-document YAML file path, in order.
func manifestObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := testenv.DecodeObjects(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// webhookProcess is "clusterip reservations webhook" running as a child process of the test.
type webhookProcess struct {
	addr    string // host:port it serves the webhook on
	probes  string // host:port of its probes, or "none"
	metrics string // host:port of its metrics, or "none"
	cmd     *exec.Cmd
	done    chan struct{} // closed when it has exited
	once    sync.Once

	mu     sync.Mutex
	output bytes.Buffer // its stderr so far
}

// listenLine is klog's line saying where the webhook serves.
var listenLine = regexp.MustCompile(`"Serving the reservations webhook" listen="([^"]+)" healthProbes="([^"]+)" metrics="([^"]+)"`)

// startWebhook runs the built command with args, with env added to this process's environment,
// waits (at most a minute) until it says where it serves, and stops it when t ends.
func startWebhook(t *testing.T, args, env []string) *webhookProcess {
	t.Helper()
	p := &webhookProcess{cmd: exec.Command(binary, args...), done: make(chan struct{})}
	// The namespace the Deployment gives it through the downward API, before env's own.
	p.cmd.Env = append(append(os.Environ(), "POD_NAMESPACE=kube-system"), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start clusterip %q: %v", args, err)
	}
	listening := make(chan []string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.output.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listenLine.FindStringSubmatch(line); m != nil {
				select {
				case listening <- m[1:]:
				default:
				}
			}
		}
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("the log of clusterip %q:\n%s", args, p.log())
		}
	})
	select {
	case addrs := <-listening:
		p.addr, p.probes, p.metrics = addrs[0], addrs[1], addrs[2]
	case <-p.done:
		t.Fatalf("clusterip %q exited before it served:\n%s", args, p.log())
	case <-time.After(time.Minute):
		t.Fatalf("clusterip %q did not say where it serves within a minute:\n%s", args, p.log())
	}
	return p
}

// log returns what the process has written on stderr.
func (p *webhookProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// stop interrupts the process, as a kubelet stopping its Pod would, and waits for it to exit,
// killing it after 20 seconds.
func (p *webhookProcess) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// writeServingCertificate writes a serving certificate for 127.0.0.1 and its key into dir as
// tls.crt and tls.key, the keys of a kubernetes.io/tls Secret, and returns the PEM of the CA that
// signed it.
func writeServingCertificate(t *testing.T, dir string) []byte {
	t.Helper()
	ca := newTestCA(t, "clusterip-reservations-webhook-ca")
	pair := ca.issue(t, "clusterip-reservations-webhook.kube-system.svc", x509.ExtKeyUsageServerAuth)
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pair.cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pair.key, 0o600); err != nil {
		t.Fatal(err)
	}
	return ca.certPEM
}

// shippedWebhookConfiguration returns the MutatingWebhookConfiguration of webhookKustomization with
// each webhook's clientConfig rewritten from the Service reference to
// https://<addr><the manifest's path>, with caPEM as its CA bundle: kube-apiserver here runs
// without a cluster network, so it cannot route to the webhook Service's ClusterIP, and with no
// kube-proxy and no Pod no Service would reach the process anyway. Nothing else is changed.
func shippedWebhookConfiguration(t *testing.T, addr string, caPEM []byte) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range testenv.Kustomize(t, webhookKustomization) {
		if obj.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		hooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
		if err != nil || len(hooks) == 0 {
			t.Fatalf("%s: the MutatingWebhookConfiguration has no webhooks: %v", webhookKustomization, err)
		}
		for i, h := range hooks {
			hook := h.(map[string]any)
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if path == "" {
				t.Fatalf("%s: webhook %d calls no Service path", webhookKustomization, i)
			}
			hook["clientConfig"] = map[string]any{"url": "https://" + addr + path, "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
		}
		if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	t.Fatalf("%s has no MutatingWebhookConfiguration", webhookKustomization)
	return nil
}

// malformedPolicyProbe is a Service whose release policy does not parse.
func malformedPolicyProbe() *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{reservation.AnnotationReleasePolicy: "Keep"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	return svc
}

// waitForWebhook waits until kube-apiserver calls the webhook: with failurePolicy Ignore a
// Service with a malformed release policy is let through until then, and refused after. It
// tries with dry runs, which the webhook declares free of side effects.
func waitForWebhook(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	poll(t, "kube-apiserver to call the webhook", func() bool {
		_, err := admin.CoreV1().Services(metav1.NamespaceDefault).Create(t.Context(), malformedPolicyProbe(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), reservation.AnnotationReleasePolicy)
	})
}

// checkMalformedPolicyRefused creates a Service with a malformed release policy and checks that
// the webhook refuses it with 422 at the annotation, and that nothing was created.
func checkMalformedPolicyRefused(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	_, err := admin.CoreV1().Services(metav1.NamespaceDefault).Create(t.Context(), malformedPolicyProbe(), metav1.CreateOptions{})
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != http.StatusUnprocessableEntity {
		t.Fatalf("create a Service with release policy %q: %v, want a 422", "Keep", err)
	}
	if want := "metadata.annotations[" + reservation.AnnotationReleasePolicy + "]"; !strings.Contains(err.Error(), want) {
		t.Errorf("create a Service with release policy %q: %v, want it refused at %s", "Keep", err, want)
	}
	if _, err := admin.CoreV1().Services(metav1.NamespaceDefault).Get(t.Context(), "probe", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused Service exists: %v", err)
	}
}

// deleteAndRecreate does what a Velero restore does to svc, which asks for no ClusterIP and
// keeps its addresses with release policy Retain: it creates svc, deletes it, waits (at most a
// minute each) until the controller has kept its addresses as reservations for its name and
// until the webhook hands them out (a dry-run create, which deletes nothing, gets them), creates
// it again as it was and returns the ClusterIPs of the first and the second. meanwhile, if not
// nil, runs once the reservations are kept, before the webhook is asked for them.
func deleteAndRecreate(t *testing.T, admin kubernetes.Interface, svc *corev1.Service, meanwhile func()) (first, second []string) {
	t.Helper()
	ctx := t.Context()
	services := admin.CoreV1().Services(svc.Namespace)
	created, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s: %v", svc.Name, err)
	}
	first = created.Spec.ClusterIPs
	if err := services.Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	owner := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	poll(t, "the reservations of the deleted Service "+owner.String(), func() bool {
		for _, ip := range first {
			obj, err := admin.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if r, ok := reservation.FromObject(obj); !ok || r.For != owner {
				return false
			}
		}
		return true
	})
	if meanwhile != nil {
		meanwhile()
	}
	poll(t, "the webhook to hand out the reservations of "+owner.String(), func() bool {
		got, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && slices.Equal(got.Spec.ClusterIPs, first)
	})
	recreated, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s again: %v", svc.Name, err)
	}
	for _, ip := range recreated.Spec.ClusterIPs {
		obj, err := admin.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if err != nil || reservation.IsReservation(obj) || obj.Labels[networkingv1.LabelManagedBy] == "" {
			t.Errorf("IPAddress %s of the recreated Service: %v, %v; want kube-apiserver's allocation", ip, obj, err)
		}
	}
	return first, recreated.Spec.ClusterIPs
}

// warningRecorder keeps the warnings the API server sends a client. It is safe for concurrent use.
type warningRecorder struct {
	mu  sync.Mutex
	got []string // guarded by mu
}

// HandleWarningHeader keeps one warning.
func (r *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, text)
}

// take returns the warnings kept since the last take.
func (r *warningRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// warnedDynamicClient sets Pod Security admission's warn level of kube-system to restricted on
// api, and returns a dynamic client of api whose warnings the recorder keeps: a workload of the
// shipped manifests that the level would refuse is then a warning the test sees.
func warnedDynamicClient(t *testing.T, api *testenv.KubeAPIServer) (dynamic.Interface, *warningRecorder) {
	t.Helper()
	if _, err := api.Client.CoreV1().Namespaces().Patch(t.Context(), metav1.NamespaceSystem, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/warn":"restricted"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	warnings := &warningRecorder{}
	cfg := rest.CopyConfig(api.Config)
	cfg.WarningHandler = warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, warnings
}

// optInToRetain annotates Namespace ns with reservation.AnnotationMaxRetained "100", so that its
// Services may retain (retaining is opt-in per namespace), once kube-apiserver has created it.
func optInToRetain(t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"` + reservation.AnnotationMaxRetained + `":"100"}}}`)
	testenv.WaitFor(t, "Namespace "+ns+" to opt in to Retain", func() bool {
		_, err := client.CoreV1().Namespaces().Patch(t.Context(), ns, types.MergePatchType, patch, metav1.PatchOptions{})
		return err == nil
	})
}

// retainedService returns the Service default/name with release policy Retain and ipFamilyPolicy
// policy, asking for no ClusterIP.
func retainedService(name string, policy corev1.IPFamilyPolicy) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{reservation.AnnotationReleasePolicy: "Retain"}},
		Spec: corev1.ServiceSpec{IPFamilyPolicy: &policy, Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

// apiserverWebhookFiles is the folder, relative to rbacDir, of kube-apiserver's admission
// configuration and kubeconfig for the reservations webhook.
const apiserverWebhookFiles = "../webhook/kube-apiserver"

// shippedWebhookUser is the user of the shipped webhook kubeconfig: the webhook Service's DNS
// name, which kube-apiserver looks up for a webhook that calls a Service on port 443.
const shippedWebhookUser = "clusterip-reservations-webhook.kube-system.svc"

// writeShippedAdmissionConfiguration writes into dir the admission configuration and webhook
// kubeconfig of apiserverWebhookFiles, with client, a client certificate, as the kubeconfig's
// files, and returns the admission configuration's path for --admission-control-config-file.
// Only the files' directory (/etc/kubernetes/clusterip/) is rewritten to dir, and the user's name
// to webhookAddr, the host:port of the URL the test calls the webhook at in place of the Service
// (see shippedWebhookConfiguration), with a copy of the user for each of spare, the addresses of
// further replicas.
func writeShippedAdmissionConfiguration(t *testing.T, dir, webhookAddr string, spare []string, client pemPair) string {
	t.Helper()
	rewrite := func(name string, paths int, user bool) string {
		b, err := os.ReadFile(filepath.Join(rbacDir, apiserverWebhookFiles, name))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if n := strings.Count(s, "/etc/kubernetes/clusterip/"); n != paths {
			t.Fatalf("%s/%s names /etc/kubernetes/clusterip/ %d times, want %d (the test rewrites it)", apiserverWebhookFiles, name, n, paths)
		}
		s = strings.ReplaceAll(s, "/etc/kubernetes/clusterip/", dir+"/")
		if user {
			if n := strings.Count(s, "name: "+shippedWebhookUser+"\n"); n != 1 {
				t.Fatalf("%s/%s has %d users named %s, want one", apiserverWebhookFiles, name, n, shippedWebhookUser)
			}
			// The user is the file's last entry: a copy of it for each spare address.
			entry := s[strings.LastIndex(s, "  - name: "+shippedWebhookUser+"\n"):]
			for _, addr := range spare {
				s += strings.Replace(entry, "name: "+shippedWebhookUser+"\n", "name: "+strconv.Quote(addr)+"\n", 1)
			}
			s = strings.Replace(s, "name: "+shippedWebhookUser+"\n", "name: "+strconv.Quote(webhookAddr)+"\n", 1)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	rewrite("webhook-kubeconfig.yaml", 2, true)
	for name, b := range map[string][]byte{"webhook-client.crt": client.cert, "webhook-client.key": client.key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return rewrite("admission-configuration.yaml", 1, false)
}

// freeLoopbackAddr returns 127.0.0.1:<a port no one listens on now>.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// forgedReview returns an AdmissionReview of the create of a Service ns/name that asks for no
// ClusterIP, as kube-apiserver would send it: what a caller that is not kube-apiserver would
// forge to make the webhook hand it a reservation.
func forgedReview(t *testing.T, ns, name string) []byte {
	t.Helper()
	svc := corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "0f0f0f0f-0000-4000-8000-000000000001",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "services"},
			Namespace: ns, Name: name, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
	b, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// shippedOptions are what a test changes of the shipped webhook's setting.
type shippedOptions struct {
	// Release is the stock kube-apiserver release (default v1.37.2).
	Release string
	// ServiceClusterIPRange is kube-apiserver's --service-cluster-ip-range.
	ServiceClusterIPRange string
	// NotSent are namespaces the MutatingWebhookConfiguration's namespaceSelector leaves out
	// besides the shipped one's, so that a test can create Services the webhook never sees.
	NotSent []string
	// Env is added to the webhook process's environment.
	Env []string
	// Args are added to the Deployment's container's arguments, such as a shorter
	// --handout-bound for a test that waits for every hand-out to end.
	Args []string
	// Spares is how many more addresses kube-apiserver presents its client certificate to,
	// for more replicas of the webhook (shippedWebhook.startReplica).
	Spares int
	// Drop names webhooks of the MutatingWebhookConfiguration the test leaves out, to show what
	// each is there for.
	Drop []string
}

// shippedWebhook is kube-apiserver with the shipped manifest applied and the webhook command
// running as a process in place of its Deployment (see startShippedWebhook).
type shippedWebhook struct {
	api   *testenv.KubeAPIServer
	p     *webhookProcess // the process now running; restart replaces it
	args  []string        // the process's arguments
	env   []string        // what is added to its environment
	caPEM []byte          // the CA of its serving certificate
	plain *http.Client    // a client for its plain-HTTP ports
	spare []string        // the addresses further replicas listen on (shippedOptions.Spares)
}

// startReplica starts another process with the arguments of s.p, listening on the next spare
// address, which kube-apiserver presents its client certificate to.
func (s *shippedWebhook) startReplica(t *testing.T) *webhookProcess {
	t.Helper()
	if len(s.spare) == 0 {
		t.Fatal("no spare address for another replica: set shippedOptions.Spares")
	}
	addr := s.spare[0]
	s.spare = s.spare[1:]
	args := slices.Clone(s.args)
	for i, a := range args {
		if strings.HasPrefix(a, "--listen=") {
			args[i] = "--listen=" + addr
		}
	}
	return startWebhook(t, args, s.env)
}

// restart stops the webhook process, if it runs, and starts another with the same arguments at
// the same address.
func (s *shippedWebhook) restart(t *testing.T) {
	t.Helper()
	s.p.stop()
	s.p = startWebhook(t, s.args, s.env)
}

// leaveOut adds namespaces to the NotIn values of the namespaceSelector of each webhook in the
// MutatingWebhookConfiguration obj.
func leaveOut(t *testing.T, obj *unstructured.Unstructured, namespaces []string) {
	t.Helper()
	hooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if rules, _, _ := unstructured.NestedSlice(h.(map[string]any), "rules"); len(rules) > 0 && rules[0].(map[string]any)["scope"] == "Cluster" {
			continue // no namespace to leave out (the IPAddress guard)
		}
		exprs, _, err := unstructured.NestedSlice(h.(map[string]any), "namespaceSelector", "matchExpressions")
		if err != nil {
			t.Fatal(err)
		}
		left := false
		for _, e := range exprs {
			expr := e.(map[string]any)
			if expr["key"] == "kubernetes.io/metadata.name" && expr["operator"] == "NotIn" {
				values := expr["values"].([]any)
				for _, ns := range namespaces {
					values = append(values, ns)
				}
				expr["values"] = values
				left = true
			}
		}
		if !left {
			t.Fatalf("%s: no namespaceSelector NotIn expression to leave namespaces out of", webhookKustomization)
		}
		if err := unstructured.SetNestedSlice(h.(map[string]any), exprs, "namespaceSelector", "matchExpressions"); err != nil {
			t.Fatal(err)
		}
	}
	if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
		t.Fatal(err)
	}
}

// startShippedWebhook applies deploy/webhook as shipped (the kustomization rendered) to a real stock kube-apiserver v1.37.2
// (RBAC, serving o.ServiceClusterIPRange) that presents the client certificate of
// deploy/webhook/kube-apiserver to the webhook, through its --admission-control-config-file: every
// object is created as it is, the Deployment too, which no node runs here. In its place it runs
// "clusterip reservations webhook" as a process with the Deployment's container's arguments,
// changing only the directories its Secret and ConfigMap are mounted at and the addresses it
// listens on (127.0.0.1: the tests use loopback addresses only; each port itself is checked
// against the container's, the Service's and the probes'), and with the ServiceAccount's
// credentials: a token of the shipped ServiceAccount, bound by the manifest to its ClusterRole,
// in the kubeconfig named by $KUBECONFIG (client-go's in-cluster config reads fixed paths). Only
// the webhook's clientConfig is rewritten to that process's URL (see
// shippedWebhookConfiguration), the kubeconfig's user to that URL's host, and the
// namespaceSelector to leave o.NotSent out too. It checks that the Deployment's probes are
// answered 200 by the process on their own plain-HTTP port and that the Pod meets the restricted
// Pod Security Standard (no warning at the create), and returns once kube-apiserver calls the
// webhook, with Namespace default opted in to Retain.
func startShippedWebhook(t *testing.T, o shippedOptions) *shippedWebhook {
	t.Helper()
	webhookAddr := freeLoopbackAddr(t)
	var spare []string
	for range o.Spares {
		spare = append(spare, freeLoopbackAddr(t))
	}
	clientCA := newTestCA(t, "kube-apiserver-webhook-client-ca")
	admissionConfig := writeShippedAdmissionConfiguration(t, t.TempDir(), webhookAddr, spare, clientCA.issue(t, "kube-apiserver", x509.ExtKeyUsageClientAuth))
	release := o.Release
	if release == "" {
		release = "v1.37.2"
	}
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		Release: release, ServiceClusterIPRange: o.ServiceClusterIPRange, AuthorizationMode: "RBAC",
		ExtraArgs: []string{"--admission-control-config-file=" + admissionConfig},
	})
	waitForDefaultServiceCIDR(t, api.Client)
	ctx := t.Context()
	objs := testenv.Kustomize(t, webhookKustomization)
	groups, err := restmapper.GetAPIGroupResources(api.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	// Pod Security admission warns of a Deployment whose Pods the namespace's warn level would
	// refuse: the webhook's Pod meets the restricted standard, so that it runs in a namespace that
	// enforces it.
	dyn, warnings := warnedDynamicClient(t, api)
	optInToRetain(t, api.Client, metav1.NamespaceDefault)
	create := func(obj *unstructured.Unstructured, from string) {
		t.Helper()
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create the %s %s of %s: %v", gvk.Kind, obj.GetName(), from, err)
		}
		if w := warnings.take(); len(w) > 0 {
			t.Errorf("the API server warned of the %s %s of %s: %q", gvk.Kind, obj.GetName(), from, w)
		}
	}

	// Everything but the MutatingWebhookConfiguration, last in the file, which needs the
	// process's address.
	var deploy appsv1.Deployment
	var svc corev1.Service
	var hooks admissionregistrationv1.MutatingWebhookConfiguration
	for _, obj := range objs {
		switch obj.GetKind() {
		case "MutatingWebhookConfiguration":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &hooks); err != nil {
				t.Fatal(err)
			}
			continue
		case "Deployment":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &deploy); err != nil {
				t.Fatal(err)
			}
		case "Service":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &svc); err != nil {
				t.Fatal(err)
			}
		}
		create(obj, webhookKustomization)
	}
	// The NetworkPolicy of the example overlay for managed clusters (the component
	// deploy/webhook-networkpolicy, its control plane's addresses filled in) is valid and selects
	// the webhook's Pods. (Nothing enforces it here: that takes a network plugin.)
	var policies int
	for _, obj := range testenv.Kustomize(t, managedClusterExample) {
		if obj.GetKind() != "NetworkPolicy" {
			continue
		}
		policies++
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, &np, true); err != nil {
			t.Fatalf("%s: NetworkPolicy %s: %v", managedClusterExample, obj.GetName(), err)
		}
		if np.Namespace != deploy.Namespace || !maps.Equal(np.Spec.PodSelector.MatchLabels, deploy.Spec.Template.Labels) {
			t.Errorf("%s: NetworkPolicy %s/%s selects %v, want the webhook's Pods %s %v", managedClusterExample, np.Namespace, np.Name, np.Spec.PodSelector.MatchLabels, deploy.Namespace, deploy.Spec.Template.Labels)
		}
		create(obj, managedClusterExample)
	}
	if policies != 1 {
		t.Errorf("%s: %d NetworkPolicies, want one", managedClusterExample, policies)
	}
	if len(deploy.Spec.Template.Spec.Containers) != 1 || len(svc.Spec.Ports) != 1 {
		t.Fatalf("%s: want a Deployment of one container and a Service of one port", webhookKustomization)
	}
	// What the test rewrites must have been right: each webhook calls the Service, at its port,
	// which is 443, so that kube-apiserver presents the credentials of the kubeconfig user named
	// after the Service.
	for _, h := range hooks.Webhooks {
		ref := h.ClientConfig.Service
		if ref == nil || ref.Namespace != svc.Namespace || ref.Name != svc.Name || ref.Port == nil || *ref.Port != svc.Spec.Ports[0].Port {
			t.Errorf("%s: webhook %s calls %+v, want the Service %s/%s at port %d", webhookKustomization, h.Name, ref, svc.Namespace, svc.Name, svc.Spec.Ports[0].Port)
		}
	}
	if want := svc.Name + "." + svc.Namespace + ".svc"; shippedWebhookUser != want || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("%s: the webhook's credentials are for %s, want %s at port 443 (the Service's port is %d)", apiserverWebhookFiles, shippedWebhookUser, want, svc.Spec.Ports[0].Port)
	}
	if len(hooks.Webhooks) == 0 {
		t.Fatalf("%s: no MutatingWebhookConfiguration with webhooks", webhookKustomization)
	}
	pod := deploy.Spec.Template.Spec
	container := pod.Containers[0]

	// The Secret (the serving certificate) and the ConfigMap (the CA of kube-apiserver's client
	// certificate) the container mounts, each in a directory of the test's.
	mounts := map[string]string{} // the container's mount path -> the test's directory
	var caPEM []byte
	for _, vm := range container.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != vm.Name {
				continue
			}
			dir := t.TempDir()
			switch {
			case v.Secret != nil && v.Secret.SecretName == "clusterip-reservations-webhook-tls":
				caPEM = writeServingCertificate(t, dir)
			case v.ConfigMap != nil && v.ConfigMap.Name == "clusterip-reservations-webhook-client-ca":
				if err := os.WriteFile(filepath.Join(dir, "ca.crt"), clientCA.certPEM, 0o600); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("%s: the container mounts volume %s, which the test does not know", webhookKustomization, v.Name)
			}
			mounts[vm.MountPath] = dir
		}
	}
	if caPEM == nil || len(mounts) != 2 {
		t.Fatalf("%s: the container mounts %v, want the TLS Secret and the client CA ConfigMap", webhookKustomization, container.VolumeMounts)
	}
	ports := map[string]int32{} // the container's ports by name
	for _, p := range container.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if port := svc.Spec.Ports[0].TargetPort; port.String() != "https" || ports["https"] == 0 {
		t.Fatalf("%s: the Service's targetPort %s, want the container's port https", webhookKustomization, port.String())
	}
	// Each of the process's addresses: the flag, the container port it must listen on, and what
	// the test listens on instead.
	listenFlags := map[string]struct {
		port string
		addr string
	}{
		"--listen":                    {"https", webhookAddr},
		"--health-probe-bind-address": {"probes", "127.0.0.1:0"},
		"--metrics-bind-address":      {"metrics", "127.0.0.1:0"},
	}
	args := slices.Clone(container.Args)
	given := map[string]int{}
	for i, a := range args {
		flag, v, _ := strings.Cut(a, "=")
		given[flag]++
		if lf, ok := listenFlags[flag]; ok {
			if _, port, err := net.SplitHostPort(v); err != nil || ports[lf.port] == 0 || port != strconv.Itoa(int(ports[lf.port])) {
				t.Errorf("%s: %s, want the container's port %s (%d)", webhookKustomization, a, lf.port, ports[lf.port])
			}
			args[i] = flag + "=" + lf.addr
		}
		for mount, dir := range mounts {
			args[i] = strings.ReplaceAll(args[i], "="+mount+"/", "="+dir+"/")
		}
	}
	for _, flag := range []string{"--listen", "--health-probe-bind-address", "--metrics-bind-address", "--client-ca-file"} {
		if given[flag] != 1 {
			t.Fatalf("%s: the container's args %q give %s %d times, want once", webhookKustomization, container.Args, flag, given[flag])
		}
	}
	args = append(args, o.Args...)

	tr, err := api.Client.CoreV1().ServiceAccounts(deploy.Namespace).CreateToken(ctx, pod.ServiceAccountName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the ServiceAccount %s/%s: %v", deploy.Namespace, pod.ServiceAccountName, err)
	}
	env := append([]string{"KUBECONFIG=" + writeKubeconfigWithToken(t, api.Config.Host, tr.Status.Token)}, o.Env...)
	p := startWebhook(t, args, env)
	// The probes a kubelet would make, without a client certificate: plain HTTP at the probes'
	// port, answered 200 by the process.
	plain := &http.Client{Timeout: 10 * time.Second}
	for _, probe := range []*corev1.Probe{container.ReadinessProbe, container.LivenessProbe, container.StartupProbe} {
		if probe == nil {
			continue
		}
		get := probe.HTTPGet
		if get == nil || (get.Scheme != "" && get.Scheme != corev1.URISchemeHTTP) || get.Port.String() != "probes" {
			t.Errorf("%s: a probe %+v, want an HTTP GET at the container's port probes", webhookKustomization, probe.ProbeHandler)
			continue
		}
		resp, err := plain.Get("http://" + p.probes + get.Path)
		if err != nil {
			t.Fatalf("%s: probe %s: %v", webhookKustomization, get.Path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: probe %s: %s, want 200", webhookKustomization, get.Path, resp.Status)
		}
	}
	if container.ReadinessProbe == nil || container.LivenessProbe == nil {
		t.Errorf("%s: the container has no readiness or no liveness probe: a new Pod would get requests before its informers synced", webhookKustomization)
	}
	hookConfig := shippedWebhookConfiguration(t, p.addr, caPEM)
	if len(o.NotSent) > 0 {
		leaveOut(t, hookConfig, o.NotSent)
	}
	if len(o.Drop) > 0 {
		dropWebhooks(t, hookConfig, o.Drop)
	}
	create(hookConfig, webhookKustomization)
	waitForWebhook(t, api.Client)
	return &shippedWebhook{api: api, p: p, args: args, env: env, caPEM: caPEM, plain: plain, spare: spare}
}

// dropWebhooks removes the webhooks named names from the MutatingWebhookConfiguration config,
// each of which it must have.
func dropWebhooks(t *testing.T, config *unstructured.Unstructured, names []string) {
	t.Helper()
	hooks, _, err := unstructured.NestedSlice(config.Object, "webhooks")
	if err != nil {
		t.Fatal(err)
	}
	kept := hooks[:0]
	for _, h := range hooks {
		if name, _, _ := unstructured.NestedString(h.(map[string]any), "name"); !slices.Contains(names, name) {
			kept = append(kept, h)
		}
	}
	if len(hooks)-len(kept) != len(names) {
		t.Fatalf("%s: dropping %q left %d of %d webhooks", webhookKustomization, names, len(kept), len(hooks))
	}
	if err := unstructured.SetNestedSlice(config.Object, kept, "webhooks"); err != nil {
		t.Fatal(err)
	}
}

// TestShippedWebhookManifestKeepsAServicesAddressesAcrossARestore runs the shipped webhook (see
// startShippedWebhook) beside stock kube-apiserver v1.37.2, dual-stack. A Service with a
// malformed release policy is refused 422 at the annotation; a dual-stack Service with release
// policy Retain, deleted and created again as a Velero restore does, gets both its ClusterIPs
// back through the webhook, also across a restart of the process; a review from a caller without
// kube-apiserver's client certificate is refused at the handshake and frees nothing; the process
// deletes a reservation when it ends; and a Retain Service deleted while the process is down stays
// Terminating with its address, and once the process is back is gone with its address kept for
// it, which a create of the same name gets back.
func TestShippedWebhookManifestKeepsAServicesAddressesAcrossARestore(t *testing.T) {
	t.Parallel()
	s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/24,fd00:10:96::/112"})
	api, ctx := s.api, t.Context()

	t.Run("a malformed release policy is refused at the annotation", func(t *testing.T) {
		checkMalformedPolicyRefused(t, api.Client)
	})
	t.Run("a dual-stack Service deleted and restored gets its ClusterIPs back", func(t *testing.T) {
		first, second := deleteAndRecreate(t, api.Client, retainedService("web", corev1.IPFamilyPolicyRequireDualStack), nil)
		if len(first) != 2 {
			t.Fatalf("the Service got ClusterIPs %q, want two families", first)
		}
		if !slices.Equal(first, second) {
			t.Errorf("ClusterIPs after the restore = %q, want %q", second, first)
		}
	})
	t.Run("a Retain Service in a namespace the webhook is not sent keeps nothing", func(t *testing.T) {
		// kube-system, which the shipped namespaceSelector leaves out: its Services' creates never
		// reach the webhook, so an address kept for one would be held for nothing.
		sys := retainedService("dns", corev1.IPFamilyPolicySingleStack)
		sys.Namespace = metav1.NamespaceSystem
		created, err := api.Client.CoreV1().Services(sys.Namespace).Create(ctx, sys, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := api.Client.CoreV1().Services(sys.Namespace).Delete(ctx, sys.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// A Service of default deleted after it is kept: by then the controller has judged both.
		deleteAndRecreate(t, api.Client, retainedService("after-dns", corev1.IPFamilyPolicySingleStack), nil)
		if obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, created.Spec.ClusterIP, metav1.GetOptions{}); err == nil && reservation.IsReservation(obj) {
			t.Errorf("the address %s of kube-system/dns is kept as a reservation after its delete: %+v", created.Spec.ClusterIP, obj)
		}
	})
	t.Run("a review from a caller without kube-apiserver's client certificate frees nothing", func(t *testing.T) {
		rc, err := reservation.New(api.Client)
		if err != nil {
			t.Fatal(err)
		}
		victim := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.200"), For: types.NamespacedName{Namespace: "prod", Name: "db"}, Reason: "the test's victim"}
		if err := rc.Reserve(ctx, victim); err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.caPEM)
		other := newTestCA(t, "another-ca").issue(t, "kube-apiserver", x509.ExtKeyUsageClientAuth)
		otherCert, err := tls.X509KeyPair(other.cert, other.key)
		if err != nil {
			t.Fatal(err)
		}
		callers := []struct {
			name  string
			certs []tls.Certificate
		}{
			{"no client certificate", nil},
			{"a client certificate another CA signed", []tls.Certificate{otherCert}},
		}
		for _, c := range callers {
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: c.certs}}}
			resp, err := client.Post("https://"+s.p.addr+"/mutate-services", "application/json", bytes.NewReader(forgedReview(t, "prod", "db")))
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Errorf("a forged review with %s: %s %s, want the handshake refused", c.name, resp.Status, body)
			}
			obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, victim.Addr.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("after a forged review with %s: the reservation of prod/db: %v, want it still there", c.name, err)
			}
			if r, ok := reservation.FromObject(obj); !ok || r.For != victim.For {
				t.Fatalf("after a forged review with %s: IPAddress %s is %v, want prod/db's reservation", c.name, victim.Addr, obj)
			}
		}
		// The metrics are not on the webhook's port: its own, plain HTTP, serves them.
		resp, err := s.plain.Get("http://" + s.p.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("clusterip_reservation_webhook_")) || !bytes.Contains(body, []byte("go_goroutines")) {
			t.Errorf("GET /metrics at the metrics port: %s, want 200 with the webhook's and Go's metrics", resp.Status)
		}
		if err := rc.Release(ctx, victim.Addr); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the process deletes a reservation when it ends", func(t *testing.T) {
		rc, err := reservation.New(api.Client)
		if err != nil {
			t.Fatal(err)
		}
		ends := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.201"), Name: "cooldown-a", Expires: time.Now().Add(3 * time.Second).UTC()}
		if err := rc.Reserve(ctx, ends); err != nil {
			t.Fatal(err)
		}
		poll(t, "the ended reservation "+ends.Addr.String()+" to be deleted", func() bool {
			_, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ends.Addr.String(), metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})
	t.Run("a Service deleted before the webhook restarts gets its ClusterIPs back from the new process", func(t *testing.T) {
		first, second := deleteAndRecreate(t, api.Client, retainedService("api", corev1.IPFamilyPolicyRequireDualStack), func() {
			// The Pod restarts: the same arguments, at the address the webhook configuration names.
			s.restart(t)
		})
		if !slices.Equal(first, second) {
			t.Errorf("ClusterIPs after the restart and the restore = %q, want %q", second, first)
		}
	})
	t.Run("a Retain Service deleted while the process is down keeps its ClusterIP", func(t *testing.T) {
		// A process of its own, at the address the webhook configuration names (the last
		// subtest's ended with it).
		s.restart(t)
		waitForWebhook(t, api.Client)
		svc := retainedService("db", corev1.IPFamilyPolicySingleStack)
		services := api.Client.CoreV1().Services(svc.Namespace)
		created, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(created.Finalizers, webhook.Finalizer) {
			t.Errorf("the created Retain Service has finalizers %q, want %s", created.Finalizers, webhook.Finalizer)
		}
		ip := created.Spec.ClusterIP
		s.p.stop() // the Deployment is down
		if err := services.Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Terminating, its address still allocated to it, until the controller is back.
		if got, err := services.Get(ctx, svc.Name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp == nil {
			t.Errorf("the Service deleted while the process is down: %v, %v; want it Terminating", got, err)
		}
		obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if err != nil || reservation.IsReservation(obj) || obj.Spec.ParentRef == nil || obj.Spec.ParentRef.Name != svc.Name {
			t.Errorf("IPAddress %s of the Terminating Service: %v, %v; want its allocation", ip, obj, err)
		}
		s.restart(t)
		owner := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		poll(t, "the Service to be gone and its address kept for it", func() bool {
			if _, err := services.Get(ctx, svc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false
			}
			obj, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			if err != nil {
				return false
			}
			r, ok := reservation.FromObject(obj)
			return ok && r.For == owner
		})
		poll(t, "the webhook to hand out the reservation of "+owner.String(), func() bool {
			got, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil && got.Spec.ClusterIP == ip
		})
		recreated, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if recreated.Spec.ClusterIP != ip {
			t.Errorf("ClusterIP of the Service created again = %s, want %s", recreated.Spec.ClusterIP, ip)
		}
		// The README's uninstall step removes the finalizer, and only it.
		s.p.stop()
		if _, err := services.Patch(ctx, svc.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["example.com/other","`+webhook.Finalizer+`"]}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := services.Patch(ctx, svc.Name, types.StrategicMergePatchType, []byte(`{"metadata":{"$deleteFromPrimitiveList/finalizers":["`+webhook.Finalizer+`"]}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("the README's patch: %v", err)
		}
		if !slices.Equal(got.Finalizers, []string{"example.com/other"}) {
			t.Errorf("after the README's patch the finalizers are %q, want [example.com/other]", got.Finalizers)
		}
	})
}

// TestReservationsWebhookCouldNotRunExitsTwoWithOneLine checks that "clusterip reservations
// webhook" refuses to start, with exit 2 and one line on stderr, without its certificate, before
// it serves anything.
func TestReservationsWebhookCouldNotRunExitsTwoWithOneLine(t *testing.T) {
	kubeconfig := writeKubeconfig(t, "https://127.0.0.1:1")
	missing := filepath.Join(t.TempDir(), "tls.crt")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no certificate", nil, "--tls-cert-file and --tls-private-key-file are required"},
		{"no key", []string{"--tls-cert-file", missing}, "--tls-cert-file and --tls-private-key-file are required"},
		{"a certificate file that is not there", []string{"--tls-cert-file", missing, "--tls-private-key-file", missing},
			"--tls-cert-file, --tls-private-key-file: open " + missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkCouldNotRun(t, slices.Concat([]string{"reservations", "webhook", "--kubeconfig", kubeconfig, "--listen", "127.0.0.1:0"}, tt.args), tt.want)
		})
	}
}
