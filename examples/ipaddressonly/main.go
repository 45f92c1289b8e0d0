// Command ipaddressonly is the ClusterIP part of a Service registry in IPAddressOnly mode, the only
// default mode of kube-apiserver v1.35 and later: it builds the allocators with clusterip.New,
// waits until they can allocate, gives a Service its ClusterIPs as kube-apiserver's registry
// would, releases them, and runs one pass of package repair. It links no etcd client: that mode
// keeps no bitmap.
//
// Run it against a cluster whose API server serves networking.k8s.io/v1 (Kubernetes 1.33 or
// later), as a user that may read Services and ServiceCIDRs and write IPAddress objects:
//
//	go run ./examples/ipaddressonly -kubeconfig ~/.kube/config -service-cluster-ip-range 10.96.0.0/12
//
// Beside a kube-apiserver, the default ServiceCIDR already exists. Where no kube-apiserver runs
// (an API server of your own), add -default-service-cidr and the program creates it from the
// range, as kube-apiserver does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file of the cluster")
	flagRange := flag.String("service-cluster-ip-range", "10.96.0.0/12", "the cluster's --service-cluster-ip-range")
	defaultCIDR := flag.Bool("default-service-cidr", false, "create the default ServiceCIDR from the range, as kube-apiserver does")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *kubeconfig, *flagRange, *defaultCIDR); err != nil {
		fmt.Fprintln(os.Stderr, "ipaddressonly:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, flagRange string, defaultCIDR bool) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	ranges, err := clusterip.ParseRanges(flagRange)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	cfg := clusterip.Config{
		Mode:               featuregate.IPAddressOnly,
		Ranges:             ranges,
		Client:             client,
		Informers:          factory,
		DefaultServiceCIDR: defaultCIDR,
	}
	allocs, err := clusterip.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer allocs.Close()
	ctx, cancel := context.WithCancel(ctx)
	factory.Start(ctx.Done()) // after New, which registers the informers it needs
	ran := make(chan error, 1)
	go func() { ran <- allocs.Run(ctx) }()
	defer func() {
		cancel() // stops Run and the informers
		<-ran
		factory.Shutdown() // waits for the informers' goroutines, which the cancel stopped
	}()
	readyCtx, cancelReady := context.WithTimeout(ctx, 30*time.Second)
	defer cancelReady()
	if err := allocs.WaitReady(readyCtx); err != nil {
		return err // a *clusterip.NotReadyError says what is missing
	}

	// What a registry does when a Service is created, then deleted.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "clusterip-example"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack)},
	}
	txn, err := allocs.Services().Allocate(ctx, svc, false)
	if err != nil {
		return err
	}
	if err := txn.Commit(ctx); err != nil { // the registry stored the Service
		return err
	}
	fmt.Printf("Service %s/%s: clusterIPs %v, ipFamilies %v\n", svc.Namespace, svc.Name, svc.Spec.ClusterIPs, svc.Spec.IPFamilies)
	if err := allocs.Services().Release(ctx, svc); err != nil { // the registry deleted it
		return err
	}

	// Audit and repair, as kube-apiserver's repair loops do every 3 minutes (Controller.Run).
	ctrl, err := repair.NewController(cfg, repair.Options{})
	if err != nil {
		return err
	}
	rep, err := ctrl.RunOnce(ctx)
	if err != nil {
		return err
	}
	return rep.WriteTable(os.Stdout)
}
