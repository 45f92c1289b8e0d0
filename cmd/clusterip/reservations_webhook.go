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
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

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
clusters: deploy/examples/managed-cluster).

The serving certificate is read again whenever its files change (cert-manager renews the Secret,
the kubelet updates the mounted files), and at least every 10 seconds: no restart is needed.

Every replica serves reviews; with --leader-elect (the default) only the one holding the Lease
--leader-elect-resource-name in --namespace runs the controllers, and a replica that loses it
exits. On SIGTERM or SIGINT the process answers 503 on /readyz, stops its controllers (the leader
gives its Lease up), serves --shutdown-delay-duration more, answers the reviews in flight and
exits 0.

The probes are on their own plain-HTTP port (--health-probe-bind-address), where a kubelet reaches
them without a client certificate: /healthz answers 200 while the process runs, /readyz once its
informers have synced and it serves reviews, until it shuts down. The metrics (admission requests
by result and their latency, the webhook's counters, the workqueues', the leader election's, the
Go runtime's and the process's) are at /metrics on --metrics-bind-address. "0" turns either port
off.

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
	shutdownDelay     time.Duration
	shutdownTimeout   time.Duration

	// Leader election, as kube's components name it (component-base's LeaderElectionConfiguration).
	leaderElect   bool
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	leaseName     string
}

func newReservationsWebhookCommand(kube *checkOptions) *cobra.Command {
	o := &reservationsWebhookOptions{listen: ":8443", healthProbeAddr: ":8081", metricsAddr: ":8080", webhookConfig: "clusterip-reservations", workers: 2, handoutBound: webhook.DefaultHandoutBound,
		shutdownTimeout: 15 * time.Second,
		leaderElect:     true, leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second,
		leaseName: "clusterip-reservations-webhook"}
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
			logger := klog.FromContext(cmd.Context())
			// Two pieces of global state, each set once per process here, where the process is
			// this verb: client-go keeps one workqueue metrics provider per process, the first
			// it is given (workqueue.SetProvider), used by every queue made after; and
			// controller-runtime one logger (the certificate watcher's lines).
			reg := prometheus.NewRegistry()
			wq, err := newWorkqueueMetrics(reg)
			if err != nil {
				return err
			}
			workqueue.SetProvider(wq)
			ctrllog.SetLogger(logger)
			return o.run(cmd.Context(), client, reg)
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
	f.DurationVar(&o.shutdownDelay, "shutdown-delay-duration", o.shutdownDelay, "after SIGTERM, how long the webhook goes on serving new reviews, with /readyz answering 503, before it drains: the time the webhook Service's endpoints take to drop the Pod")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", o.shutdownTimeout, "after the delay, how long the reviews in flight have to be answered before the process exits anyway (with an error)")
	f.BoolVar(&o.leaderElect, "leader-elect", o.leaderElect, "run the controllers only in the replica that holds the Lease --leader-elect-resource-name in --namespace; every replica serves reviews. false: this process runs them (one replica only)")
	f.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", o.leaseDuration, "how long the other replicas wait after the leader's last renewal before one takes the Lease")
	f.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", o.renewDeadline, "how long the leader tries to renew the Lease before it stops leading (and the process exits); below the lease duration")
	f.DurationVar(&o.retryPeriod, "leader-elect-retry-period", o.retryPeriod, "how often a replica tries to take, and the leader to renew, the Lease")
	f.StringVar(&o.leaseName, "leader-elect-resource-name", o.leaseName, "the Lease of the leader election, in --namespace (the Role in deploy/webhook grants get and update on this name only)")
	return cmd
}

// tlsConfig returns the webhook listener's TLS configuration: the serving certificate of
// getCertificate, and with --client-ca-file a client certificate that CA signed (and, with
// --client-allowed-names, one of those names), checked at the handshake.
func (o *reservationsWebhookOptions) tlsConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)) (*tls.Config, error) {
	cfg := &tls.Config{GetCertificate: getCertificate, MinVersion: tls.VersionTLS12}
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

// run serves until ctx is done (SIGTERM or SIGINT), then shuts down as a Pod being stopped must:
// /readyz answers 503 at once and the controllers stop (the leader gives its Lease up, so that
// another replica takes over without waiting for it to expire); the webhook goes on serving for
// --shutdown-delay-duration, until the webhook Service's endpoints no longer send it reviews, then
// stops listening and answers the reviews in flight (at most --shutdown-timeout), and run returns
// nil. It returns an error if it could not start, if a server failed, if this replica led and
// lost its Lease (kube's components exit then too: a new process starts clean), or if the
// reviews in flight were not all answered in time.
func (o *reservationsWebhookOptions) run(ctx context.Context, client kubernetes.Interface, reg *prometheus.Registry) error {
	logger := klog.FromContext(ctx)
	// Read before anything starts: a wrong path is an error at once, not after "Serving". The
	// watcher reads the files again when they change (cert-manager renews the Secret, the
	// kubelet updates the mounted files) and every 10 seconds: each handshake gets the newest.
	certs, err := certwatcher.New(o.certFile, o.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert-file, --tls-private-key-file: %w", err)
	}
	tlsCfg, err := o.tlsConfig(certs.GetCertificate)
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
	if o.shutdownDelay < 0 || o.shutdownTimeout <= 0 {
		return fmt.Errorf("--shutdown-delay-duration %v, --shutdown-timeout %v: must not be negative, and above zero", o.shutdownDelay, o.shutdownTimeout)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}

	// What every replica runs: the informers the Handler reads.
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
	// The Service informer: every replica refuses kube-apiserver's release of a reservation the
	// controller kept in place (HandlerOptions.Services), by the Services that hold the address.
	h, err := webhook.NewHandler(client, factory.Networking().V1().IPAddresses(), webhook.HandlerOptions{Metrics: m, Handouts: handouts, Limits: limits,
		ServiceCIDRs: factory.Networking().V1().ServiceCIDRs(), Services: factory.Core().V1().Services()})
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
	if o.clientCAFile == "" {
		logger.Info("Warning: no --client-ca-file, so any caller that reaches the webhook's port is served and can make it hand out a reservation; admit only the control plane to it (a NetworkPolicy)")
	}

	// The controllers, built only where they run (the leader): a replica that does not lead
	// queues no Service's delete. Each Retain Service keeps a finalizer
	// until the controller has kept its addresses, so deletes while no replica leads wait for
	// the next leader.
	runControllers := func(ctx context.Context) error {
		ctrl, err := webhook.NewController(client, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Handouts: handouts, ServiceCIDRs: factory.Networking().V1().ServiceCIDRs(), Sent: sent, Limits: limits})
		if err != nil {
			return err
		}
		expiry, err := reservation.NewExpiryController(client, factory.Networking().V1().IPAddresses())
		if err != nil {
			return err
		}
		factory.Start(ctx.Done()) // started already: the Handler's informers include the Service informer
		done := make(chan error, 2)
		go func() { done <- ctrl.Run(ctx, o.workers) }()
		go func() { done <- expiry.Run(ctx) }()
		return errors.Join(<-done, <-done)
	}
	var elector *leaderelection.LeaderElector
	// The controllers' context: the shutdown cancels it before it stops the election, so that
	// the leader gives its Lease up only once its controllers have returned, and the next
	// leader's never run beside them.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	ctrlCtx, stopCtrl := context.WithCancel(work)
	defer stopCtrl()
	ctrlDone := make(chan error, 1) // the controllers' end, once they have started
	leading := make(chan struct{})  // closed when this replica starts leading
	lost := make(chan struct{})     // closed when it stops leading but was not told to
	if o.leaderElect {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader election identity: %w", err)
		}
		identity := host + "_" + string(uuid.NewUUID())
		elector, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: o.leaseName},
				Client:     client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
			},
			Name:          o.leaseName,
			LeaseDuration: o.leaseDuration,
			RenewDeadline: o.renewDeadline,
			RetryPeriod:   o.retryPeriod,
			// Given up only after the controllers have returned (see the shutdown below).
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leadCtx context.Context) {
					close(leading)
					ctx, cancel := context.WithCancel(ctrlCtx)
					defer cancel()
					defer context.AfterFunc(leadCtx, cancel)()
					logger.Info("Leading: running the controllers", "lease", namespace+"/"+o.leaseName, "identity", identity)
					ctrlDone <- runControllers(ctx)
				},
				OnStoppedLeading: func() {
					if ctrlCtx.Err() == nil { // not the shutdown
						close(lost)
					}
				},
				OnNewLeader: func(id string) {
					if id != identity {
						logger.Info("Another replica leads and runs the controllers", "lease", namespace+"/"+o.leaseName, "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("--leader-elect: %w", err)
		}
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

	// Everything but the webhook server stops with work, which outlives ctx by the drain: a
	// review in flight still reads the informers and writes to the API server.
	mux := http.NewServeMux()
	mux.Handle("/mutate-services", h)
	mux.Handle("/guard-ipaddresses", h) // the same Handler: it tells the two by the request's resource
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return work }, TLSConfig: tlsCfg}
	var ready atomic.Bool
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not serving: informers not synced, or shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	metrics := http.NewServeMux()
	// With controller-runtime's registry, which its certificate watcher fills
	// (certwatcher_read_certificate_total and _errors_total), with the leader election's
	// leader_election_master_status and client-go's rest_client_requests_total.
	metrics.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{reg, ctrlmetrics.Registry}, promhttp.HandlerOpts{}))

	// Every server's end: the first error stops the process.
	var side []*http.Server
	serveErr := make(chan error, 4)
	for _, s := range []struct {
		ln      net.Listener
		handler http.Handler
	}{{probeLn, probes}, {metricsLn, metrics}} {
		if s.ln == nil {
			continue
		}
		hs := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
		side = append(side, hs)
		go func() { serveErr <- hs.Serve(s.ln) }()
	}
	go func() {
		if err := certs.Start(work); err != nil {
			serveErr <- fmt.Errorf("watch --tls-cert-file, --tls-private-key-file: %w", err)
		}
	}()

	factory.Start(work.Done())
	defer factory.Shutdown()
	configFactory.Start(work.Done())
	defer configFactory.Shutdown()
	leaseFactory.Start(work.Done())
	defer leaseFactory.Shutdown()
	// The controllers, or the election that decides whether they run here.
	electCtx, stopElect := context.WithCancel(work)
	defer stopElect()
	electionDone := make(chan struct{})
	if elector != nil {
		go func() { defer close(electionDone); elector.Run(electCtx) }()
	} else {
		close(electionDone)
		go func() { ctrlDone <- runControllers(ctrlCtx) }()
	}
	// Serve only once the informers have synced: before, the handler would find no reservation
	// and let a Service through without its addresses (a new Pod of a rolling update, say).
	// Meanwhile requests wait in the listener's backlog, until kube-apiserver gives up after the
	// webhook's timeoutSeconds and failurePolicy decides, and /readyz (the Deployment's readiness
	// probe) answers 503.
	factory.WaitForCacheSync(ctx.Done())
	configFactory.WaitForCacheSync(ctx.Done())
	leaseFactory.WaitForCacheSync(ctx.Done())
	served := ctx.Err() == nil
	if served {
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
		ready.Store(true)
		logger.Info("Serving the reservations webhook", "listen", ln.Addr().String(), "healthProbes", addrOf(probeLn), "metrics", addrOf(metricsLn), "clientCertificates", o.clientCAFile != "", "leaderElection", o.leaderElect)
	} else {
		_ = ln.Close()
	}

	select {
	case err = <-serveErr:
		err = fmt.Errorf("serve: %w", err)
	case <-lost:
		err = fmt.Errorf("lost the leader election Lease %s/%s: exiting, so that a new process starts clean", namespace, o.leaseName)
	case err = <-ctrlDone:
		if err == nil {
			err = errors.New("the controllers stopped")
		}
		ctrlDone <- nil // for the wait below
	case <-ctx.Done():
	}
	// The shutdown. Readiness first: the endpoints controller takes the Pod out of the webhook
	// Service while the webhook still serves.
	ready.Store(false)
	why := err
	if why == nil {
		why = context.Cause(ctx) // the signal
	}
	logger.Info("Shutting down: not ready; stopping the controllers, then draining the webhook", "delay", o.shutdownDelay, "reason", why.Error())
	// Each connection closes after its next response, so that kube-apiserver's next review
	// opens one to another replica.
	srv.SetKeepAlivesEnabled(false)
	// The controllers stop before the leader gives its Lease up: the next leader's never run
	// beside them. (A replica that starts leading just now runs them with ctrlCtx done: they
	// return at once, having done nothing.)
	stopCtrl()
	if !o.leaderElect {
		err = errors.Join(err, <-ctrlDone)
	} else {
		select {
		case <-leading:
			err = errors.Join(err, <-ctrlDone)
		default:
		}
	}
	stopElect()
	<-electionDone
	if served {
		// Reviews sent meanwhile are served.
		select {
		case <-time.After(o.shutdownDelay):
		case serr := <-serveErr:
			err = errors.Join(err, fmt.Errorf("serve: %w", serr))
		}
		drainCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), o.shutdownTimeout)
		if derr := srv.Shutdown(drainCtx); derr != nil {
			err = errors.Join(err, fmt.Errorf("drain the reviews in flight (--shutdown-timeout %v): %w", o.shutdownTimeout, derr))
		}
		stop()
	}
	stopWork()
	sideCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	for _, s := range side {
		_ = s.Shutdown(sideCtx)
	}
	if err == nil {
		logger.Info("Shut down: every review in flight was answered")
	}
	return err
}
