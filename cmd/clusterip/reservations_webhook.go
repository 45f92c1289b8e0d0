package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

const reservationsWebhookLong = `Serve the mutating admission webhook and run the controllers of package reservation/webhook,
which give a stock kube-apiserver reservations' two hooks: a Service created without a ClusterIP
gets the address reserved for its namespace/name, and a Service deleted with the annotation
clusterip.kube-ipam.io/release-policy: Retain[/<duration>] leaves its addresses reserved for its
name. Only a Service whose creates kube-apiserver sends to the webhook, by the namespaceSelector
and objectSelector of its MutatingWebhookConfiguration (--webhook-configuration), keeps its
addresses: a name the webhook never sees created would hold them for nothing. A malformed
release-policy annotation is refused, and so is a Retain policy in a namespace whose Namespace has
no clusterip.kube-ipam.io/max-retained annotation, or that would keep more addresses than it says;
a ServiceCIDR's clusterip.kube-ipam.io/max-reserved caps what is kept in it. The process also deletes each
reservation when it ends (a Retain/<duration>, a ServiceCIDR's release cooldown, or one created
with --expires or --for-duration): without it a reservation with an end would be kept for ever.

The webhook is at /mutate-services (HTTPS, --listen). The webhook deletes the reservation it hands
out, so only kube-apiserver may call it: with --client-ca-file it refuses, at the TLS handshake,
every caller without a client certificate signed by that CA (kube-apiserver presents one through
its --admission-control-config-file; deploy/webhook ships both files), and with
--client-allowed-names only those names. Without --client-ca-file any caller that reaches the
port is served: use it only where a NetworkPolicy admits the control plane alone (managed
clusters, deploy/webhook/networkpolicy.yaml).

The probes are on their own plain-HTTP port (--health-probe-bind-address), where a kubelet reaches
them without a client certificate: /healthz answers 200 while the process runs, /readyz once its
informers have synced and it serves reviews. The metrics (the webhook's, the Go runtime's and
the process's) are at /metrics on --metrics-bind-address. "0" turns either port off.

Before it hands a reservation out, the webhook records the hand-out in a Lease in --namespace
(every replica shares them); while the record exists no other Service may ask for the address by
spec.clusterIP(s), and if no Service holds it within --handout-bound (its create failed after the
webhook, or the review was forged) the reservation is put back, counted in
clusterip_reservation_webhook_handouts_returned_total.

Each hook leaves a short window in which another Service can take the address; the windows lost
are counted in clusterip_reservation_webhook_window_lost_total and
clusterip_reservation_controller_window_lost_total. See deploy/webhook for the manifests; the
ClusterRole there grants exactly what it calls.

Without --kubeconfig, $KUBECONFIG or ~/.kube/config it uses the in-cluster config.`

// reservationsWebhookOptions are the flags of "reservations webhook".
type reservationsWebhookOptions struct {
	certFile, keyFile string
	clientCAFile      string
	clientNames       []string
	listen            string
	healthProbeAddr   string
	metricsAddr       string
	webhookConfig     string
	workers           int
	namespace         string
	handoutBound      time.Duration
}

func newReservationsWebhookCommand(kube *checkOptions) *cobra.Command {
	o := &reservationsWebhookOptions{listen: ":8443", healthProbeAddr: ":8081", metricsAddr: ":8080", webhookConfig: "clusterip-reservations", workers: 2, handoutBound: webhook.DefaultHandoutBound}
	cmd := &cobra.Command{
		Use:   "webhook --tls-cert-file FILE --tls-private-key-file FILE [--client-ca-file FILE]",
		Short: "Serve the reservations webhook and run its controllers, for a stock kube-apiserver",
		Long:  reservationsWebhookLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.certFile == "" || o.keyFile == "" {
				return errors.New("--tls-cert-file and --tls-private-key-file are required")
			}
			if len(o.clientNames) > 0 && o.clientCAFile == "" {
				return errors.New("--client-allowed-names needs --client-ca-file")
			}
			_, cfg, err := kube.kubeClient()
			if err != nil {
				return err
			}
			// Informers watch for minutes: no whole-request timeout on their client.
			noTimeout := *cfg
			noTimeout.Timeout = 0
			client, err := kubernetes.NewForConfig(&noTimeout)
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			return o.run(cmd.Context(), client)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.certFile, "tls-cert-file", "", "the serving certificate (PEM), for the webhook Service's DNS name")
	f.StringVar(&o.keyFile, "tls-private-key-file", "", "the serving certificate's private key (PEM)")
	f.StringVar(&o.clientCAFile, "client-ca-file", "", "the CA (PEM) that signed kube-apiserver's webhook client certificate: callers without one it signed are refused")
	f.StringSliceVar(&o.clientNames, "client-allowed-names", nil, "with --client-ca-file, the client certificate's common name or a DNS name must be one of these (default: any the CA signed)")
	f.StringVar(&o.listen, "listen", o.listen, "the address to serve the webhook on (HTTPS)")
	f.StringVar(&o.healthProbeAddr, "health-probe-bind-address", o.healthProbeAddr, `the address to serve /healthz and /readyz on (plain HTTP); "0" for none`)
	f.StringVar(&o.metricsAddr, "metrics-bind-address", o.metricsAddr, `the address to serve /metrics on (plain HTTP); "0" for none`)
	f.StringVar(&o.webhookConfig, "webhook-configuration", o.webhookConfig, "the MutatingWebhookConfiguration that registers the webhook: only a deleted Service whose create it sends to the webhook (its namespaceSelector and objectSelector) keeps its addresses")
	f.IntVar(&o.workers, "workers", o.workers, "controller workers, each waiting up to 10s for a deleted Service's address")
	f.StringVar(&o.namespace, "namespace", "", "the namespace of the hand-out records (Leases) every replica shares (default: $POD_NAMESPACE, else the Pod's service account namespace)")
	f.DurationVar(&o.handoutBound, "handout-bound", o.handoutBound, "how long a Service handed a reservation has to hold its address before the reservation is put back: kube-apiserver's longest request plus the webhook's timeout")
	return cmd
}

// tlsConfig returns the webhook listener's TLS configuration: the serving certificate, and with
// --client-ca-file a client certificate that CA signed (and, with --client-allowed-names, one of
// those names), checked at the handshake.
func (o *reservationsWebhookOptions) tlsConfig() (*tls.Config, error) {
	// Loaded before anything starts: a wrong path is an error at once, not after "Serving".
	cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file, --tls-private-key-file: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if o.clientCAFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(o.clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("--client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--client-ca-file %s: no PEM certificate in it", o.clientCAFile)
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.ClientCAs = pool
	if names := slices.Clone(o.clientNames); len(names) > 0 {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no client certificate")
			}
			leaf := cs.PeerCertificates[0]
			if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
				return nil
			}
			return fmt.Errorf("client certificate %q is none of --client-allowed-names", leaf.Subject.CommonName)
		}
	}
	return cfg, nil
}

// listenPlain listens on addr for a plain-HTTP side server (probes, metrics), or returns a nil
// listener for "0" or "".
func listenPlain(flag, addr string) (net.Listener, error) {
	if addr == "0" || addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return ln, nil
}

// addrOf returns ln's address, or "none" for no listener.
func addrOf(ln net.Listener) string {
	if ln == nil {
		return "none"
	}
	return ln.Addr().String()
}

// run serves until ctx is done.
func (o *reservationsWebhookOptions) run(ctx context.Context, client kubernetes.Interface) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	logger := klog.FromContext(ctx)
	tlsCfg, err := o.tlsConfig()
	if err != nil {
		return err
	}
	namespace, err := handoutNamespace(o.namespace)
	if err != nil {
		return err
	}
	if o.handoutBound <= 0 {
		return fmt.Errorf("--handout-bound %v: must be above zero", o.handoutBound)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	// One Namespace informer, shared by the caps and Sent.
	limits, err := reservation.NewLimits(factory.Networking().V1().IPAddresses(), factory.Core().V1().Namespaces(), factory.Networking().V1().ServiceCIDRs())
	if err != nil {
		return err
	}
	// The hand-out records alone: RBAC grants Leases in this namespace only.
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, webhook.HandoutInformerOptions(namespace)...)
	handouts, err := webhook.NewHandouts(client, leaseFactory.Coordination().V1().Leases(), namespace, webhook.HandoutsOptions{Bound: o.handoutBound})
	if err != nil {
		return err
	}
	h, err := webhook.NewHandler(client, factory.Networking().V1().IPAddresses(), webhook.HandlerOptions{Metrics: m, Handouts: handouts, Limits: limits, ServiceCIDRs: factory.Networking().V1().ServiceCIDRs()})
	if err != nil {
		return err
	}
	// The webhook's own configuration alone: RBAC grants its name.
	configFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", o.webhookConfig).String()
	}))
	sent, err := webhook.NewSent(configFactory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), o.webhookConfig)
	if err != nil {
		return err
	}
	ctrl, err := webhook.NewController(client, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Handouts: handouts, ServiceCIDRs: factory.Networking().V1().ServiceCIDRs(), Sent: sent, Limits: limits})
	if err != nil {
		return err
	}
	expiry, err := reservation.NewExpiryController(client, factory.Networking().V1().IPAddresses())
	if err != nil {
		return err
	}
	if o.clientCAFile == "" {
		logger.Info("Warning: no --client-ca-file, so any caller that reaches the webhook's port is served and can make it hand out a reservation; admit only the control plane to it (a NetworkPolicy)")
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	probeLn, err := listenPlain("health-probe-bind-address", o.healthProbeAddr)
	if err != nil {
		_ = ln.Close()
		return err
	}
	metricsLn, err := listenPlain("metrics-bind-address", o.metricsAddr)
	if err != nil {
		_ = ln.Close()
		if probeLn != nil {
			_ = probeLn.Close()
		}
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/mutate-services", h)
	mux.Handle("/guard-ipaddresses", h) // the same Handler: it tells the two by the request's resource
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }, TLSConfig: tlsCfg}
	var ready atomic.Bool
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	// Every server's end: the first error stops the process.
	servers := []*http.Server{srv}
	serveErr := make(chan error, 3)
	for _, side := range []struct {
		ln      net.Listener
		handler http.Handler
	}{{probeLn, probes}, {metricsLn, metrics}} {
		if side.ln == nil {
			continue
		}
		s := &http.Server{Handler: side.handler, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		go func() { serveErr <- s.Serve(side.ln) }()
	}

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	configFactory.Start(ctx.Done())
	defer configFactory.Shutdown()
	leaseFactory.Start(ctx.Done())
	defer leaseFactory.Shutdown()
	ctrlDone := make(chan error, 2)
	go func() { ctrlDone <- ctrl.Run(ctx, o.workers) }()
	go func() { ctrlDone <- expiry.Run(ctx) }()
	// Serve only once the informers have synced: before, the handler would find no reservation
	// and let a Service through without its addresses (a new Pod of a rolling update, say).
	// Meanwhile requests wait in the listener's backlog, until kube-apiserver gives up after the
	// webhook's timeoutSeconds and failurePolicy decides, and /readyz (the Deployment's readiness
	// probe) answers 503.
	factory.WaitForCacheSync(ctx.Done())
	configFactory.WaitForCacheSync(ctx.Done())
	leaseFactory.WaitForCacheSync(ctx.Done())
	if ctx.Err() == nil {
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
		ready.Store(true)
		logger.Info("Serving the reservations webhook", "listen", ln.Addr().String(), "healthProbes", addrOf(probeLn), "metrics", addrOf(metricsLn), "clientCertificates", o.clientCAFile != "")
	} else {
		_ = ln.Close()
	}

	select {
	case err = <-serveErr:
		err = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	cancel()
	shutdownCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	for _, s := range servers {
		_ = s.Shutdown(shutdownCtx)
	}
	for range 2 {
		if cerr := <-ctrlDone; err == nil {
			err = cerr
		}
	}
	return err
}
