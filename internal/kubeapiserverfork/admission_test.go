package kubeapiserverfork_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The addresses the admission policy of TestForkAuditsAndAdmitsIPAddressWritesAsStock denies:
// those whose name starts with deniedPrefix.
const (
	deniedPrefix = "10.96.0.7"
	deniedIP     = "10.96.0.77" // a Service asks for it
	probeIP      = "10.96.0.79" // created directly, to learn that the policy is in force
	auditedIP    = "10.96.0.20" // a Service gets it, and its writes are looked for in the audit log
)

// denyIPAddresses makes s refuse, with a ValidatingAdmissionPolicy, every IPAddress
// create whose name starts with deniedPrefix, and waits until it does.
func denyIPAddresses(ctx context.Context, t *testing.T, s *testenv.KubeAPIServer) {
	t.Helper()
	vap := s.Client.AdmissionregistrationV1()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-ipaddresses"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{"networking.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"ipaddresses"},
						},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "!object.metadata.name.startsWith('" + deniedPrefix + "')",
				Message:    "this address is kept out of service",
			}},
		},
	}
	if _, err := vap.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicy: %v", err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-ipaddresses"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	if _, err := vap.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicyBinding: %v", err)
	}
	ipas := s.Client.NetworkingV1().IPAddresses()
	testenv.WaitFor(t, "the admission policy in force", func() bool {
		_, err := ipas.Create(ctx, testenv.IPAddress(probeIP, metav1.NamespaceDefault, "probe"), metav1.CreateOptions{})
		if err == nil {
			if err := ipas.Delete(ctx, probeIP, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("delete the probe IPAddress: %v", err)
			}
			return false
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Fatalf("probe IPAddress create: %v, want a refusal by the policy", err)
		}
		return true
	})
}

// answer is what a client sees of a request's outcome: its HTTP status code and message (200
// and "" for a success).
type answer struct {
	Code    int32
	Message string
}

// answerOf returns the answer err carries.
func answerOf(err error) answer {
	if err == nil {
		return answer{Code: 200}
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return answer{status.Status().Code, status.Status().Message}
	}
	return answer{Message: err.Error()}
}

// ipAddressWrites returns the requests of user on the IPAddress object of ip that the audit log
// of s holds, as verb and code, in the order logged.
func ipAddressWrites(t *testing.T, s *testenv.KubeAPIServer, user, ip string) []answer {
	t.Helper()
	events, err := testenv.AuditEvents(s.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []answer
	for _, ev := range events {
		if ev.User.Username != user || ev.ObjectRef == nil || ev.ObjectRef.Resource != "ipaddresses" || ev.ObjectRef.Name != ip || ev.ResponseStatus == nil {
			continue
		}
		out = append(out, answer{int32(ev.ResponseStatus.Code), ev.Verb})
	}
	return out
}

// TestForkAuditsAndAdmitsIPAddressWritesAsStock starts stock and the fork, with an audit log of
// every request and a ValidatingAdmissionPolicy that refuses some IPAddress objects: by default
// the fork's allocator writes are audited as system:apiserver's, and refused by the policy with
// the answer stock gives; with the registry write path, an operator's choice, they are neither.
func TestForkAuditsAndAdmitsIPAddressWritesAsStock(t *testing.T) {
	t.Parallel()
	sides := forkSides(t)
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			auditsAndAdmits(t, modeOrSkip(t, mode), sides)
		})
	}
}

// auditsAndAdmits is TestForkAuditsAndAdmitsIPAddressWritesAsStock in mode mg.
func auditsAndAdmits(t *testing.T, mg modeGate, sides []forkSide) {
	const apiserverUser = "system:apiserver"
	denied := map[string]answer{}
	for _, side := range sides {
		t.Run(side.name, func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			opts := mg.options(side.bin, v4Range)
			opts.Env, opts.AuditLog = side.env, true
			s := testenv.NewKubeAPIServer(t, etcd, opts)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			denyIPAddresses(ctx, t, s)

			svcs := s.Client.CoreV1().Services(metav1.NamespaceDefault)
			_, err := svcs.Create(ctx, testenv.ClusterIPService("denied", deniedIP), metav1.CreateOptions{})
			denied[side.name] = answerOf(err)
			createService(ctx, t, s, "audited", auditedIP)
			deleteService(ctx, t, s, "audited")
			// The audit log is written in blocking mode: before the server's own requests are
			// answered, and so before the Service's. The repair loop may add requests of its
			// own (a create answered 409 when its cache still shows the Service, say): what
			// matters is whether the allocator's create and delete are there.
			got := ipAddressWrites(t, s, apiserverUser, auditedIP)
			allocatorWrites := []answer{{201, "create"}, {200, "delete"}}
			for _, w := range allocatorWrites {
				switch logged := slices.Contains(got, w); {
				case side.name == "fork/registry" && logged:
					t.Errorf("audit log: %s's requests on IPAddress %s = %v; the registry path logs no %v", apiserverUser, auditedIP, got, w)
				case side.name != "fork/registry" && !logged:
					t.Errorf("audit log: %s's requests on IPAddress %s = %v, want %v among them", apiserverUser, auditedIP, got, w)
				}
			}
		})
	}
	if t.Failed() {
		return
	}
	if st := denied["stock"]; st.Code == 200 {
		t.Errorf("stock granted a ClusterIP whose IPAddress the policy refuses; the test expects a refusal")
	}
	if st, fk := denied["stock"], denied["fork"]; st != fk {
		t.Errorf("a Service asking for %s, which the policy refuses: stock answers %+v, the fork %+v", deniedIP, st, fk)
	}
	if got := denied["fork/registry"]; got.Code != 200 {
		t.Errorf("a Service asking for %s on the fork writing through its registry: %+v, want it granted (admission does not see those writes)", deniedIP, got)
	}
}

// TestForkRefusesAnUnknownWritePath starts the fork with a CLUSTERIP_IPADDRESS_WRITES it does
// not know: it stops at start-up, saying which values it takes.
func TestForkRefusesAnUnknownWritePath(t *testing.T) {
	// As klog quotes the error in the log.
	assertStartFails(t, localcluster.KubeAPIServerOptions{Binary: forkBinary(t), ServiceClusterIPRange: v4Range, Env: []string{"CLUSTERIP_IPADDRESS_WRITES=Registry"}},
		`cannot create cluster IP allocator: CLUSTERIP_IPADDRESS_WRITES=\"Registry\": want \"loopback\" (the default) or \"registry\"`)
}

// assertStartFails starts kube-apiserver with opts on a new etcd and fails t unless it stops at
// start-up with want in its log.
func assertStartFails(t *testing.T, opts localcluster.KubeAPIServerOptions, want string) {
	t.Helper()
	etcd := testenv.NewEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := localcluster.StartKubeAPIServer(ctx, etcd, opts)
	if err == nil {
		s.Close()
		t.Fatalf("kube-apiserver started with %v", opts.Env)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("start: %v\nwant the log to say %q", err, want)
	}
}
