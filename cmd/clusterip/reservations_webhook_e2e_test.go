package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
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
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// webhookManifest is the manifest of the reservations webhook, relative to rbacDir.
const webhookManifest = "../webhook/webhook.yaml"

// manifestObjects returns the objects of the multi-document YAML file path, in order.
func manifestObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// webhookProcess is "clusterip reservations webhook" running as a child process of the test.
type webhookProcess struct {
	addr string // host:port it serves on
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	once sync.Once

	mu     sync.Mutex
	output bytes.Buffer // its stderr so far
}

// listenLine is klog's line saying where the webhook serves.
var listenLine = regexp.MustCompile(`"Serving the reservations webhook" listen="([^"]+)"`)

// startWebhook runs the built command with args, with env added to this process's environment,
// waits (at most a minute) until it says where it serves, and stops it when t ends.
func startWebhook(t *testing.T, args, env []string) *webhookProcess {
	t.Helper()
	p := &webhookProcess{cmd: exec.Command(binary, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start clusterip %q: %v", args, err)
	}
	listening := make(chan string, 1)
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
				case listening <- m[1]:
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
	case p.addr = <-listening:
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

// shippedWebhookConfiguration returns the MutatingWebhookConfiguration of webhookManifest with
// each webhook's clientConfig rewritten from the Service reference to
// https://<addr><the manifest's path>, with caPEM as its CA bundle: kube-apiserver here runs
// without a cluster network, so it cannot route to the webhook Service's ClusterIP, and with no
// kube-proxy and no Pod no Service would reach the process anyway. Nothing else is changed.
func shippedWebhookConfiguration(t *testing.T, addr string, caPEM []byte) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range manifestObjects(t, filepath.Join(rbacDir, webhookManifest)) {
		if obj.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		hooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
		if err != nil || len(hooks) == 0 {
			t.Fatalf("%s: the MutatingWebhookConfiguration has no webhooks: %v", webhookManifest, err)
		}
		for i, h := range hooks {
			hook := h.(map[string]any)
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if path == "" {
				t.Fatalf("%s: webhook %d calls no Service path", webhookManifest, i)
			}
			hook["clientConfig"] = map[string]any{"url": "https://" + addr + path, "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
		}
		if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	t.Fatalf("%s has no MutatingWebhookConfiguration", webhookManifest)
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

// retainedService returns the Service default/name with release policy Retain and ipFamilyPolicy
// policy, asking for no ClusterIP.
func retainedService(name string, policy corev1.IPFamilyPolicy) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{reservation.AnnotationReleasePolicy: "Retain"}},
		Spec: corev1.ServiceSpec{IPFamilyPolicy: &policy, Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

// TestShippedWebhookManifestKeepsAServicesAddressesAcrossARestore applies deploy/webhook as
// shipped to a real stock kube-apiserver v1.37.2 (dual-stack, RBAC): every object is created as
// it is, the Deployment too, which no node runs here. In its place the test runs
// "clusterip reservations webhook" as a process with the Deployment's container's arguments,
// changing only the directory the TLS Secret is mounted at and the listen address (a free port
// on 127.0.0.1: the tests use loopback addresses only; the port itself is checked against the
// container's and the Service's), and with the ServiceAccount's credentials: a token of the
// shipped ServiceAccount, bound by the manifest to its ClusterRole, in the kubeconfig named by
// $KUBECONFIG (client-go's in-cluster config reads fixed paths). Only the webhook's clientConfig
// is rewritten to that process's URL (see shippedWebhookConfiguration). The Deployment's readiness
// probe is answered 200 at the container's port, and the Pod meets the restricted Pod Security
// Standard (no warning at the create). Then a Service with a
// malformed release policy is refused 422 at the annotation, and a dual-stack Service with
// release policy Retain, deleted and created again as a Velero restore does, gets both its
// ClusterIPs back through the webhook.
func TestShippedWebhookManifestKeepsAServicesAddressesAcrossARestore(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24,fd00:10:96::/112", AuthorizationMode: "RBAC",
	})
	waitForDefaultServiceCIDR(t, api.Client)
	ctx := t.Context()
	objs := manifestObjects(t, filepath.Join(rbacDir, webhookManifest))
	groups, err := restmapper.GetAPIGroupResources(api.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	// Pod Security admission warns of a Deployment whose Pods the namespace's warn level would
	// refuse: the webhook's Pod meets the restricted standard, so that it runs in a namespace that
	// enforces it.
	if _, err := api.Client.CoreV1().Namespaces().Patch(ctx, metav1.NamespaceSystem, types.MergePatchType,
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
	create := func(obj *unstructured.Unstructured) {
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
			t.Fatalf("create the %s %s of %s: %v", gvk.Kind, obj.GetName(), webhookManifest, err)
		}
		if w := warnings.take(); len(w) > 0 {
			t.Errorf("the API server warned of the %s %s of %s: %q", gvk.Kind, obj.GetName(), webhookManifest, w)
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
			// Its caBundle is a placeholder, which does not decode: the rest does.
			o := obj.DeepCopy()
			for _, h := range o.Object["webhooks"].([]any) {
				unstructured.RemoveNestedField(h.(map[string]any), "clientConfig", "caBundle")
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &hooks); err != nil {
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
		create(obj)
	}
	if len(deploy.Spec.Template.Spec.Containers) != 1 || len(svc.Spec.Ports) != 1 {
		t.Fatalf("%s: want a Deployment of one container and a Service of one port", webhookManifest)
	}
	// What the test rewrites must have been right: each webhook calls the Service, at its port.
	for _, h := range hooks.Webhooks {
		ref := h.ClientConfig.Service
		if ref == nil || ref.Namespace != svc.Namespace || ref.Name != svc.Name || ref.Port == nil || *ref.Port != svc.Spec.Ports[0].Port {
			t.Errorf("%s: webhook %s calls %+v, want the Service %s/%s at port %d", webhookManifest, h.Name, ref, svc.Namespace, svc.Name, svc.Spec.Ports[0].Port)
		}
	}
	if len(hooks.Webhooks) == 0 {
		t.Fatalf("%s: no MutatingWebhookConfiguration with webhooks", webhookManifest)
	}
	pod := deploy.Spec.Template.Spec
	container := pod.Containers[0]

	// The TLS Secret's volume, and the port the Service sends to.
	var mount string
	for _, vm := range container.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.Secret != nil {
				mount = vm.MountPath
			}
		}
	}
	if mount == "" {
		t.Fatalf("%s: the container mounts no Secret", webhookManifest)
	}
	var containerPort int32
	for _, p := range container.Ports {
		if p.Name == svc.Spec.Ports[0].TargetPort.String() || p.ContainerPort == svc.Spec.Ports[0].TargetPort.IntVal {
			containerPort = p.ContainerPort
		}
	}
	if containerPort == 0 {
		t.Fatalf("%s: the Service's targetPort %s is no port of the container", webhookManifest, svc.Spec.Ports[0].TargetPort.String())
	}
	dir := t.TempDir()
	caPEM := writeServingCertificate(t, dir)
	args := slices.Clone(container.Args)
	listens := 0
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			listens++
			if _, port, err := net.SplitHostPort(v); err != nil || port != strconv.Itoa(int(containerPort)) {
				t.Errorf("%s: --listen=%s, want the containerPort %d the Service sends to", webhookManifest, v, containerPort)
			}
			args[i] = "--listen=127.0.0.1:0"
		}
		args[i] = strings.ReplaceAll(args[i], "="+mount+"/", "="+dir+"/")
	}
	if listens != 1 {
		t.Fatalf("%s: the container's args %q give --listen=ADDRESS %d times, want once (the test substitutes it)", webhookManifest, container.Args, listens)
	}

	tr, err := api.Client.CoreV1().ServiceAccounts(deploy.Namespace).CreateToken(ctx, pod.ServiceAccountName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the ServiceAccount %s/%s: %v", deploy.Namespace, pod.ServiceAccountName, err)
	}
	p := startWebhook(t, args, []string{"KUBECONFIG=" + writeKubeconfigWithToken(t, api.Config.Host, tr.Status.Token)})
	// The probes a kubelet would make: at the container's port, answered 200 by the process.
	for _, probe := range []*corev1.Probe{container.ReadinessProbe, container.LivenessProbe, container.StartupProbe} {
		if probe == nil {
			continue
		}
		get := probe.HTTPGet
		if get == nil || get.Scheme != corev1.URISchemeHTTPS || (get.Port.String() != "https" && get.Port.IntVal != containerPort) {
			t.Errorf("%s: a probe %+v, want an HTTPS GET at the container's port", webhookManifest, probe.ProbeHandler)
			continue
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := client.Get("https://" + p.addr + get.Path)
		if err != nil {
			t.Fatalf("%s: probe %s: %v", webhookManifest, get.Path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: probe %s: %s, want 200", webhookManifest, get.Path, resp.Status)
		}
	}
	if container.ReadinessProbe == nil {
		t.Errorf("%s: the container has no readiness probe: a new Pod would get requests before its informers synced", webhookManifest)
	}
	create(shippedWebhookConfiguration(t, p.addr, caPEM))
	waitForWebhook(t, api.Client)

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
	t.Run("a Service deleted before the webhook restarts gets its ClusterIPs back from the new process", func(t *testing.T) {
		first, second := deleteAndRecreate(t, api.Client, retainedService("api", corev1.IPFamilyPolicyRequireDualStack), func() {
			// The Pod restarts: the same arguments, at the address the webhook configuration names.
			p.stop()
			again := slices.Clone(args)
			for i, a := range again {
				if strings.HasPrefix(a, "--listen=") {
					again[i] = "--listen=" + p.addr
				}
			}
			p = startWebhook(t, again, []string{"KUBECONFIG=" + writeKubeconfigWithToken(t, api.Config.Host, tr.Status.Token)})
		})
		if !slices.Equal(first, second) {
			t.Errorf("ClusterIPs after the restart and the restore = %q, want %q", second, first)
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
