package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/reservation/webhook"
)

const reservationsWebhookLong = `Serve the mutating admission webhook and run the controller of package reservation/webhook,
which give a stock kube-apiserver reservations' two hooks: a Service created without a ClusterIP
gets the address reserved for its namespace/name, and a Service deleted with the annotation
clusterip.kube-ipam.io/release-policy: Retain[/<duration>] leaves its addresses reserved for its
name. A malformed release-policy annotation is refused.

The webhook is at /mutate-services (HTTPS), the metrics at /metrics on the same listener, and
/readyz answers once it serves, after its informers have synced. Each hook leaves a short window
in which another Service can take the address; the windows lost are counted in
clusterip_reservation_webhook_window_lost_total and
clusterip_reservation_controller_window_lost_total. See deploy/webhook for the manifests; the
ClusterRole there grants exactly what it calls.

Without --kubeconfig, $KUBECONFIG or ~/.kube/config it uses the in-cluster config.`

// reservationsWebhookOptions are the flags of "reservations webhook".
type reservationsWebhookOptions struct {
	certFile, keyFile string
	listen            string
	workers           int
}

func newReservationsWebhookCommand(kube *checkOptions) *cobra.Command {
	o := &reservationsWebhookOptions{listen: ":8443", workers: 2}
	cmd := &cobra.Command{
		Use:   "webhook --tls-cert-file FILE --tls-private-key-file FILE",
		Short: "Serve the reservations webhook and run its controller, for a stock kube-apiserver",
		Long:  reservationsWebhookLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.certFile == "" || o.keyFile == "" {
				return errors.New("--tls-cert-file and --tls-private-key-file are required")
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
	f.StringVar(&o.listen, "listen", o.listen, "the address to serve HTTPS on")
	f.IntVar(&o.workers, "workers", o.workers, "controller workers, each waiting up to 10s for a deleted Service's address")
	return cmd
}

// run serves until ctx is done.
func (o *reservationsWebhookOptions) run(ctx context.Context, client kubernetes.Interface) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}
	claims := &webhook.Claims{}
	factory := informers.NewSharedInformerFactory(client, 0)
	h, err := webhook.NewHandler(client, factory.Networking().V1().IPAddresses(), webhook.HandlerOptions{Metrics: m, Claims: claims})
	if err != nil {
		return err
	}
	ctrl, err := webhook.NewController(client, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Claims: claims, ServiceCIDRs: factory.Networking().V1().ServiceCIDRs()})
	if err != nil {
		return err
	}
	// Loaded before anything starts: a wrong path is an error at once, not after "Serving".
	cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert-file, --tls-private-key-file: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mutate-services", h)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx },
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- ctrl.Run(ctx, o.workers) }()
	// Serve only once the informers have synced: before, the handler would find no reservation
	// and let a Service through without its addresses (a new Pod of a rolling update, say).
	// Meanwhile requests wait in the listener's backlog, until kube-apiserver gives up after the
	// webhook's timeoutSeconds and failurePolicy decides, and /readyz (the Deployment's readiness
	// probe) does not answer.
	factory.WaitForCacheSync(ctx.Done())
	if ctx.Err() != nil {
		_ = ln.Close()
		return <-ctrlDone
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.ServeTLS(ln, "", "") }()
	klog.FromContext(ctx).Info("Serving the reservations webhook", "listen", ln.Addr().String())

	select {
	case err = <-srvDone:
		cancel()
		<-ctrlDone
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_ = srv.Shutdown(shutdownCtx)
	return <-ctrlDone
}
