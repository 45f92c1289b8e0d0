package localcluster_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestKubeAPIServerDualWrite runs a v1.33 apiserver with its defaults and
// checks it allocates ClusterIPs and serves networking.k8s.io/v1.
func TestKubeAPIServerDualWrite(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	v, err := s.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("ServerVersion() error = %v", err)
	}
	if v.GitVersion != localcluster.KubeAPIServerVersion {
		t.Errorf("ServerVersion() = %s, want %s", v.GitVersion, localcluster.KubeAPIServerVersion)
	}

	svc, err := s.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("web", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("ClusterIP %q: %v", svc.Spec.ClusterIP, err)
	}
	if want := netip.MustParsePrefix("10.96.0.0/24"); !want.Contains(ip) {
		t.Errorf("ClusterIP = %s, want one in %s", ip, want)
	}

	// Dual write: the apiserver records its allocation as an IPAddress too.
	ipa, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get IPAddress %s: %v", ip, err)
	}
	if ref := ipa.Spec.ParentRef; ref == nil || ref.Resource != "services" || ref.Name != "web" {
		t.Errorf("IPAddress %s parentRef = %+v, want services default/web", ip, ref)
	}
	ipas, err := s.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list IPAddresses: %v", err)
	}
	t.Logf("%d IPAddresses", len(ipas.Items))

	// The apiserver creates the default ServiceCIDR from its flags shortly
	// after it is ready.
	var cidr *networkingv1.ServiceCIDR
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := s.Client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].Name == "kubernetes" {
				cidr = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for ServiceCIDR kubernetes: %v", err)
	}
	if got, want := cidr.Spec.CIDRs, []string{"10.96.0.0/24"}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("ServiceCIDR kubernetes CIDRs = %v, want %v", got, want)
	}
}

// TestKubeAPIServerRelease137 starts stock kube-apiserver v1.37.2 by its release and checks that
// it is that release, by --version and by /version, and that it allocates as v1.37 does by
// default: IPAddress objects only (IPAddressOnly), no bitmap in etcd.
func TestKubeAPIServerRelease137(t *testing.T) {
	const release = "v1.37.2"
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{Release: release})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	bin, err := localcluster.KubeAPIServerReleaseBinary(ctx, release)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if got, want := strings.TrimSpace(string(out)), "Kubernetes "+release; err != nil || got != want {
		t.Errorf("%s --version = %q, %v, want %q", bin, got, err, want)
	}
	v, err := s.Client.Discovery().ServerVersion() // GET /version
	if err != nil {
		t.Fatalf("ServerVersion() error = %v", err)
	}
	if v.GitVersion != release || v.Major != "1" || v.Minor != "37" {
		t.Errorf("/version = %s (major %q, minor %q), want %s (major \"1\", minor \"37\")", v.GitVersion, v.Major, v.Minor, release)
	}

	svc, err := s.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("web", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	if _, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, svc.Spec.ClusterIP, metav1.GetOptions{}); err != nil {
		t.Errorf("get IPAddress %s: %v", svc.Spec.ClusterIP, err)
	}
	resp, err := etcd.TestClient(t).Get(ctx, "/registry/ranges/serviceips")
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("etcd key /registry/ranges/serviceips: %d values, want none (v1.37 allocates from IPAddress objects only)", len(resp.Kvs))
	}
}

// TestKubeAPIServerLegacyAllocator checks that with MultiCIDRServiceAllocator
// off, the apiserver keeps its allocations in the bitmap key in etcd.
func TestKubeAPIServerLegacyAllocator(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{FeatureGates: "MultiCIDRServiceAllocator=false"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if _, err := s.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("web", ""), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Service: %v", err)
	}
	c := etcd.TestClient(t)
	resp, err := c.Get(ctx, "/registry/ranges/serviceips")
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("etcd key /registry/ranges/serviceips: got %d values, want 1", len(resp.Kvs))
	}
}

// TestKubeAPIServerDualStackPrefix checks a dual-stack range and a custom
// etcd prefix.
func TestKubeAPIServerDualStackPrefix(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{
		ServiceClusterIPRange: "10.97.0.0/24,fd00:97::/112",
		EtcdPrefix:            "/other",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	svc := testenv.ClusterIPService("web", "")
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc.Spec.IPFamilyPolicy = &policy
	svc, err := s.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("ClusterIPs = %v, want one IPv4 and one IPv6", svc.Spec.ClusterIPs)
	}
	for i, want := range []netip.Prefix{netip.MustParsePrefix("10.97.0.0/24"), netip.MustParsePrefix("fd00:97::/112")} {
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIPs[i]); err != nil || !want.Contains(ip) {
			t.Errorf("ClusterIPs[%d] = %s, want one in %s", i, svc.Spec.ClusterIPs[i], want)
		}
	}
	c := etcd.TestClient(t)
	resp, err := c.Get(ctx, "/other/services/specs/default/web", clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	if resp.Count != 1 {
		t.Errorf("etcd key /other/services/specs/default/web: count %d, want 1", resp.Count)
	}
}

// TestKubeAPIServerSurvivesEtcdRestart checks the fault the interop tests
// inject: etcd goes away under a running apiserver and comes back.
func TestKubeAPIServerSurvivesEtcdRestart(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	etcd.Stop()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err := s.Client.CoreV1().Services("default").Create(short, testenv.ClusterIPService("down", ""), metav1.CreateOptions{})
	cancelShort()
	if err == nil {
		t.Errorf("create Service with etcd stopped succeeded, want an error")
	}
	if err := etcd.Restart(ctx); err != nil {
		t.Fatalf("Restart() error = %v", err)
	}
	start := time.Now()
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := s.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("up", ""), metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Logf("create Service: %v", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("apiserver did not recover after etcd restart: %v", err)
	}
	t.Logf("apiserver served again %v after etcd restart", time.Since(start).Round(time.Millisecond))
}

// TestKubeAPIServerWithRBACAuthorizesUsersByTheirBindings starts a server with RBAC, a token
// user and an audit log: the user may do nothing until the administrator binds it a role, and
// the audit log records its requests.
func TestKubeAPIServerWithRBACAuthorizesUsersByTheirBindings(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	s := testenv.NewKubeAPIServer(t, etcd, localcluster.KubeAPIServerOptions{
		AuthorizationMode: "RBAC", AuditLog: true, Users: []localcluster.User{{Name: "viewer", Groups: []string{"viewers"}}},
	})
	ctx := t.Context()
	if s.UserConfig("nobody") != nil {
		t.Errorf("UserConfig of a user not in Users is not nil")
	}
	viewer := kubernetes.NewForConfigOrDie(s.UserConfig("viewer"))
	if _, err := viewer.CoreV1().Services("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list Services as a user with no binding: %v, want Forbidden", err)
	}
	// Not the built-in view: kube-controller-manager, which does not run, aggregates its rules.
	if _, err := s.Client.RbacV1().Roles("default").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "services-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create a Role as the administrator: %v", err)
	}
	if _, err := s.Client.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "viewers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "services-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "viewers"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind the group viewers as the administrator: %v", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := viewer.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("list Services as a member of a bound group: %v", err)
	}
	log, err := os.ReadFile(s.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"username":"viewer"`) {
		t.Errorf("the audit log %s has no request of user viewer", s.AuditLogPath)
	}
}
