package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// The process of "clusterip reservations webhook" as a Deployment runs it: its serving
// certificate rotated under it, SIGTERM, and two replicas with one leader. Each test runs the
// shipped manifest's arguments (startShippedWebhook) beside stock kube-apiserver v1.37.2.

// certFlagDir returns the directory of the file the flag (--tls-cert-file=) of args names.
func certFlagDir(t *testing.T, args []string, flag string) string {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return filepath.Dir(v)
		}
	}
	t.Fatalf("no %s in %q", flag, args)
	return ""
}

// projectSecret writes pair into dir as the kubelet writes a mounted Secret: the files in a
// directory of their own (..<version>), a symlink ..data to it, swapped atomically, and tls.crt
// and tls.key as symlinks through ..data; the directory of the version before is then removed.
func projectSecret(t *testing.T, dir, version string, pair pemPair) {
	t.Helper()
	versioned := filepath.Join(dir, ".."+version)
	if err := os.Mkdir(versioned, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": pair.cert, "tls.key": pair.key} {
		if err := os.WriteFile(filepath.Join(versioned, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(".."+version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// derOf returns the DER of the first certificate in pemBytes.
func derOf(t *testing.T, pemBytes []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(pemBytes)
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}

// setWebhookClientConfig sets the caBundle of every webhook of the shipped
// MutatingWebhookConfiguration to caPEM, if not nil, and its URL's host:port to addr, if not
// empty.
func setWebhookClientConfig(t *testing.T, s *shippedWebhook, caPEM []byte, addr string) {
	t.Helper()
	hooks := s.api.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cfg, err := hooks.Get(t.Context(), "clusterip-reservations", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Webhooks {
		if caPEM != nil {
			cfg.Webhooks[i].ClientConfig.CABundle = caPEM
		}
		if addr != "" {
			u, err := url.Parse(*cfg.Webhooks[i].ClientConfig.URL)
			if err != nil {
				t.Fatal(err)
			}
			u.Host = addr
			to := u.String()
			cfg.Webhooks[i].ClientConfig.URL = &to
		}
	}
	if _, err := hooks.Update(t.Context(), cfg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestShippedWebhookServesARotatedCertificateWithoutARestart rotates the serving certificate
// of the shipped webhook under the running process, as cert-manager and the kubelet do (a new
// certificate of the same CA, the mounted Secret's files swapped through their ..data symlink),
// and checks that the process presents the new one at the next handshake, that kube-apiserver's
// reviews are answered with it, and that the process was not restarted.
func TestShippedWebhookServesARotatedCertificateWithoutARestart(t *testing.T) {
	s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	dir := certFlagDir(t, s.args, "--tls-cert-file")
	// The Secret as the kubelet mounts it, issued by cert-manager's CA, which the webhook
	// configuration's caBundle names (cert-manager's CA injector).
	ca := newTestCA(t, "cert-manager-ca")
	first := ca.issue(t, "clusterip-reservations-webhook.kube-system.svc", x509.ExtKeyUsageServerAuth)
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	projectSecret(t, dir, "2026_12_03_first", first)
	s.restart(t)
	setWebhookClientConfig(t, s, ca.certPEM, "")
	waitForWebhook(t, s.api.Client)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.certPEM)
	// The certificate the webhook presents at a handshake, verified against the CA. The
	// handshake presents no client certificate, which the webhook refuses once it has sent its
	// own: the certificate is read where the client verifies it.
	served := func() ([]byte, error) {
		var got []byte
		conn, err := tls.Dial("tcp", s.p.addr, &tls.Config{RootCAs: roots, VerifyConnection: func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0].Raw
			return nil
		}})
		if conn != nil {
			conn.Close()
		}
		if got == nil {
			return nil, fmt.Errorf("no certificate presented: %v", err)
		}
		return got, nil
	}
	if got, err := served(); err != nil || !bytes.Equal(got, derOf(t, first.cert)) {
		t.Fatalf("before the rotation the webhook presents another certificate than the first (%v)", err)
	}
	pid := s.p.cmd.Process.Pid

	second := ca.issue(t, "clusterip-reservations-webhook.kube-system.svc", x509.ExtKeyUsageServerAuth)
	rotated := time.Now()
	projectSecret(t, dir, "2026_12_03_second", second)
	poll(t, "the webhook to present the rotated certificate", func() bool {
		got, err := served()
		return err == nil && bytes.Equal(got, derOf(t, second.cert))
	})
	t.Logf("the rotated certificate was presented %v after the files were swapped", time.Since(rotated).Round(time.Millisecond))
	// kube-apiserver's next reviews, on new connections, get it; its old connections keep the
	// first, which is as valid.
	checkMalformedPolicyRefused(t, s.api.Client)
	select {
	case <-s.p.done:
		t.Fatalf("the webhook process exited:\n%s", s.p.log())
	default:
	}
	if s.p.cmd.Process.Pid != pid {
		t.Errorf("the webhook process is %d, want %d: no restart", s.p.cmd.Process.Pid, pid)
	}
}

// TestShippedWebhookAnswersTheReviewsInFlightAtSIGTERM creates many Services with release policy
// Retain at once beside the shipped webhook and sends it SIGTERM while their reviews are in
// flight, as a kubelet stopping the Pod does. Every create must have been answered by the
// webhook (the finalizer it adds to a Retain Service is there: with failurePolicy Ignore a
// review the webhook did not answer lets the Service through without it), /readyz must answer
// 503 during the shutdown, and the process must exit 0.
func TestShippedWebhookAnswersTheReviewsInFlightAtSIGTERM(t *testing.T) {
	s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	const n = 40
	services := s.api.Client.CoreV1().Services(metav1.NamespaceDefault)
	var wg sync.WaitGroup
	errs := make([]error, n)
	got := make([]*corev1.Service, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = services.Create(t.Context(), retainedService(fmt.Sprintf("inflight-%d", i), corev1.IPFamilyPolicySingleStack), metav1.CreateOptions{})
		}()
	}
	close(start)
	sent := time.Now()
	if err := s.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Not ready from the signal on, while it still serves.
	poll(t, "/readyz to answer 503 after SIGTERM", func() bool {
		select {
		case <-s.p.done:
			t.Fatalf("the webhook exited (%v) before /readyz answered 503:\n%s", s.p.cmd.ProcessState, s.p.log())
		default:
		}
		resp, err := s.plain.Get("http://" + s.p.probes + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	wg.Wait()
	answered := time.Since(sent)
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("create Service inflight-%d: %v, want it answered", i, errs[i])
		case !slices.Contains(got[i].Finalizers, webhook.Finalizer):
			t.Errorf("Service inflight-%d was created without %s: the webhook did not answer its review", i, webhook.Finalizer)
		}
	}
	select {
	case <-s.p.done:
	case <-time.After(time.Minute):
		t.Fatal("the webhook did not exit within a minute of SIGTERM")
	}
	exited := time.Since(sent)
	if code := s.p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the webhook exited %d after SIGTERM, want 0:\n%s", code, s.p.log())
	}
	if !strings.Contains(s.p.log(), "Shut down: every review in flight was answered") {
		t.Errorf("the webhook's log does not say it drained:\n%s", s.p.log())
	}
	t.Logf("%d creates answered %v after SIGTERM; the process exited after %v", n, answered.Round(time.Millisecond), exited.Round(time.Millisecond))
}

// leads reports whether the webhook process p says, in its metrics, that it holds the leader
// election's Lease.
func leads(t *testing.T, client *http.Client, p *webhookProcess) bool {
	t.Helper()
	resp, err := client.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == `leader_election_master_status{name="clusterip-reservations-webhook"} 1` {
			return true
		}
	}
	return false
}

// TestShippedWebhookFailoverMovesTheControllersToTheOtherReplica runs two replicas of the
// shipped webhook with a short lease, kills the one that leads (SIGKILL: no Lease given up), and
// deletes a Retain Service after the kill: it waits, Terminating, until the other replica takes
// the Lease and its controller keeps the address for the Service's name, which a create of the
// same name gets back from the surviving replica's webhook. Nothing is lost.
func TestShippedWebhookFailoverMovesTheControllersToTheOtherReplica(t *testing.T) {
	s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/24", Spares: 1,
		Args: []string{"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}})
	ctx := t.Context()
	b := s.startReplica(t)
	replicas := []*webhookProcess{s.p, b}

	var leader, other *webhookProcess
	poll(t, "one replica to lead", func() bool {
		var l []*webhookProcess
		for _, p := range replicas {
			if leads(t, s.plain, p) {
				l = append(l, p)
			}
		}
		if len(l) != 1 {
			return false
		}
		leader = l[0]
		other = replicas[0]
		if other == leader {
			other = replicas[1]
		}
		return true
	})
	if leads(t, s.plain, other) {
		t.Fatal("both replicas lead")
	}
	// The Retain Service, created while both run: it has the finalizer.
	svc := retainedService("db", corev1.IPFamilyPolicySingleStack)
	services := s.api.Client.CoreV1().Services(svc.Namespace)
	created, err := services.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(created.Finalizers, webhook.Finalizer) {
		t.Fatalf("the Retain Service has finalizers %q, want %s", created.Finalizers, webhook.Finalizer)
	}
	ip := created.Spec.ClusterIP

	if err := leader.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-leader.done
	killed := time.Now()
	// The webhook Service's endpoints are the surviving replica's alone.
	setWebhookClientConfig(t, s, nil, other.addr)
	if err := services.Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	owner := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	poll(t, "the other replica to lead", func() bool { return leads(t, s.plain, other) })
	t.Logf("the other replica leads %v after the kill", time.Since(killed).Round(time.Millisecond))
	poll(t, "the Service to be gone and its address kept for it", func() bool {
		if _, err := services.Get(ctx, svc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false
		}
		obj, err := s.api.Client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if err != nil {
			return false
		}
		r, ok := reservation.FromObject(obj)
		return ok && r.For == owner
	})
	t.Logf("the address was kept %v after the kill", time.Since(killed).Round(time.Millisecond))
	poll(t, "the surviving webhook to hand out the reservation of "+owner.String(), func() bool {
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

	// The new leader's metrics: its reviews (the patched recreate among them), its controllers'
	// workqueues, its leadership, its certificate reads, Go's and the process's.
	resp, err := s.plain.Get("http://" + other.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`clusterip_reservation_webhook_admission_requests_total{result="patched"} `,
		`clusterip_reservation_webhook_admission_duration_seconds_bucket{result="patched",le=`,
		`workqueue_adds_total{name="` + webhook.ControllerName + `"} `,
		`workqueue_depth{name="` + webhook.HandoutControllerName + `"} `,
		`workqueue_work_duration_seconds_bucket{name="` + reservation.ExpiryControllerName + `",le=`,
		`leader_election_master_status{name="clusterip-reservations-webhook"} 1`,
		"certwatcher_read_certificate_total ",
		"go_goroutines ",
		"process_cpu_seconds_total ",
	} {
		if !bytes.Contains(body, []byte("\n"+want)) {
			t.Errorf("the new leader's /metrics has no %s", want)
		}
	}
	if bytes.Contains(body, []byte(`clusterip_reservation_webhook_admission_requests_total{result="patched"} 0`)) {
		t.Error("the new leader counted no patched review, though it handed a reservation out")
	}
}

// TestShippedWebhookExitsWhenItLosesItsLease runs the shipped webhook with a short lease and
// gives its leader election's Lease to another holder, as a replica would take it after a
// partition: the process stops leading once it cannot renew within its renew deadline, and
// exits non-zero saying so, so that its controllers never run beside another leader's and a new
// process starts clean.
func TestShippedWebhookExitsWhenItLosesItsLease(t *testing.T) {
	s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/24",
		Args: []string{"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}})
	poll(t, "the webhook to lead", func() bool { return leads(t, s.plain, s.p) })
	leases := s.api.Client.CoordinationV1().Leases(metav1.NamespaceSystem)
	poll(t, "the Lease to be given to another holder", func() bool {
		l, err := leases.Get(t.Context(), "clusterip-reservations-webhook", metav1.GetOptions{})
		if err != nil {
			return false
		}
		other, long := "another-replica", int32(3600)
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = &other, &long, &now, &now
		_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
		return err == nil
	})
	taken := time.Now()
	select {
	case <-s.p.done:
	case <-time.After(time.Minute):
		t.Fatal("the webhook did not exit within a minute of losing its Lease")
	}
	if code := s.p.cmd.ProcessState.ExitCode(); code != exitCouldNotRun {
		t.Errorf("the webhook exited %d after losing its Lease, want %d", code, exitCouldNotRun)
	}
	if want := "clusterip: lost the leader election Lease kube-system/clusterip-reservations-webhook"; !strings.Contains(s.p.log(), want) {
		t.Errorf("the webhook's log does not say %q:\n%s", want, s.p.log())
	}
	t.Logf("the webhook exited %v after its Lease was taken", time.Since(taken).Round(time.Millisecond))
}
