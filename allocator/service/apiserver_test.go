package service_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

var updateMatrix = flag.Bool("update-matrix", false, "rewrite ../../testdata/services.yaml from what real kube-apiservers answer")

// TestServiceMatrixKubeAPIServer runs every case of the Service matrix against a real
// kube-apiserver v1.33.13 per cluster shape, one at a time, in its default mode and in Legacy
// mode (MultiCIDRServiceAllocator off), and checks that it answers what the matrix expects:
// results, status codes, reasons, field paths and texts. With -update-matrix it records the
// answers into the matrix instead: the default mode's, and the Legacy mode's texts where they
// differ (its results must not).
func TestServiceMatrixKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	m := &matrixFile{Clusters: matrixClusters, Cases: matrixInputs()}
	if !*updateMatrix {
		m = loadMatrix(t)
	}
	etcd := testenv.NewEtcd(t)
	runs, agreed := 0, 0
	for _, cl := range m.Clusters {
		for _, legacy := range []bool{false, true} {
			mode, gates := "default", ""
			if legacy {
				mode, gates = "Legacy", "MultiCIDRServiceAllocator=false"
			}
			t.Run(cl.Name+"/"+mode, func(t *testing.T) {
				ranges := clusterRanges(t, cl)
				api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
					ServiceClusterIPRange: strings.Join(cl.Ranges, ","),
					EtcdPrefix:            "/registry-" + cl.Name + "-" + strings.ToLower(mode),
					FeatureGates:          gates,
				})
				ctx := context.Background()
				waitForDefaultNamespace(t, ctx, api.Client)
				for i := range m.Cases {
					tc := &m.Cases[i]
					got := runCaseOnAPIServer(t, ctx, api.Client, ranges, fmt.Sprintf("m%d", i), *tc)
					if *updateMatrix {
						recordExpect(t, tc, cl.Name, legacy, got)
						continue
					}
					runs++
					want, ok := tc.Expect[cl.Name]
					if !ok {
						t.Errorf("%s: no expectation for cluster %s", tc.Name, cl.Name)
						continue
					}
					want = expectIn(want, legacy)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("%s: kube-apiserver disagrees with the matrix (-want +got):\n%s", tc.Name, diff)
						continue
					}
					agreed++
				}
			})
		}
	}
	if *updateMatrix {
		if err := writeMatrix(m, "a real kube-apiserver "+testenv.KubeAPIServerVersion+" per cluster shape"); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d cases × %d clusters", matrixPath, len(m.Cases), len(m.Clusters))
		return
	}
	t.Logf("%d of %d case runs (%d cases × %d clusters × 2 modes) agree with kube-apiserver %s",
		agreed, runs, len(m.Cases), len(m.Clusters), testenv.KubeAPIServerVersion)
}

// recordExpect records got, what a server of the mode answered to tc on cluster: the default
// mode's answer whole, the Legacy mode's texts where they differ from it. A Legacy result that
// differs fails t, as the matrix holds one result per cluster.
func recordExpect(t *testing.T, tc *matrixCase, cluster string, legacy bool, got matrixExpect) {
	t.Helper()
	if tc.Expect == nil {
		tc.Expect = map[string]matrixExpect{}
	}
	if !legacy {
		tc.Expect[cluster] = got
		return
	}
	e := tc.Expect[cluster]
	if diff := cmp.Diff(e.Create, got.Create); diff != "" {
		t.Errorf("%s: Legacy mode's create result differs from the default mode's (-default +Legacy):\n%s", tc.Name, diff)
	}
	if diff := cmp.Diff(e.Update, got.Update); diff != "" {
		t.Errorf("%s: Legacy mode's update result differs from the default mode's (-default +Legacy):\n%s", tc.Name, diff)
	}
	e.CreateText = withLegacy(e.CreateText, got.CreateText)
	e.UpdateText = withLegacy(e.UpdateText, got.UpdateText)
	tc.Expect[cluster] = e
}

// withLegacy returns def with legacy as its Legacy text when the two differ.
func withLegacy(def, legacy *matrixText) *matrixText {
	if def == nil || legacy == nil || cmp.Equal(def, legacy) {
		return def
	}
	out := *def
	out.Legacy = legacy
	return &out
}

// expectIn returns e with the texts of the mode.
func expectIn(e matrixExpect, legacy bool) matrixExpect {
	e.CreateText = e.CreateText.In(legacy)
	e.UpdateText = e.UpdateText.In(legacy)
	return e
}

// runCaseOnAPIServer creates (and updates) the case's Service through the API and returns what
// the server answered, then deletes everything it created.
func runCaseOnAPIServer(t *testing.T, ctx context.Context, c kubernetes.Interface, ranges []netip.Prefix, name string, tc matrixCase) matrixExpect {
	t.Helper()
	services := c.CoreV1().Services("default")
	defer func() {
		for _, n := range []string{name, name + "-taken-0", name + "-taken-1"} {
			_ = services.Delete(ctx, n, metav1.DeleteOptions{})
		}
	}()
	served := map[corev1.IPFamily]bool{}
	for _, p := range ranges {
		served[familyOfPrefix(p)] = true
	}
	for i, ip := range tc.Taken {
		a := netip.MustParseAddr(ip)
		if !served[familyOfPrefix(netip.PrefixFrom(a, 0))] {
			continue
		}
		single := corev1.IPFamilyPolicySingleStack
		blocker := matrixService(fmt.Sprintf("%s-taken-%d", name, i), matrixSpec{})
		blocker.Spec.IPFamilyPolicy = &single
		blocker.Spec.ClusterIP, blocker.Spec.ClusterIPs = ip, []string{ip}
		if _, err := services.Create(ctx, blocker, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: create the Service holding %s: %v", tc.Name, ip, err)
		}
	}
	var got matrixExpect
	created, err := services.Create(ctx, matrixService(name, tc.Create), metav1.CreateOptions{})
	got.Create = resultOf(t, tc, ranges, created, nil, err)
	got.CreateText = textOf(t, tc, ranges, nil, err)
	if err != nil || tc.Update == nil {
		return got
	}
	svc := created.DeepCopy()
	applySpec(svc, *tc.Update, created)
	updated, err := services.Update(ctx, svc, metav1.UpdateOptions{})
	r := resultOf(t, tc, ranges, updated, created, err)
	got.Update = &r
	got.UpdateText = textOf(t, tc, ranges, created, err)
	return got
}

func familyOfPrefix(p netip.Prefix) corev1.IPFamily {
	if p.Addr().Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// waitForDefaultNamespace waits until the apiserver's bootstrap has created the default
// namespace, which it does shortly after it reports ready.
func waitForDefaultNamespace(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace default: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
