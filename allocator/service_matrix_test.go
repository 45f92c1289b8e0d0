package allocator_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The Service matrix lives in the module's testdata/services.yaml; testdata/README.md documents
// its schema. These types mirror it.

// matrixPath is the matrix file, relative to this package.
var matrixPath = filepath.Join("..", "testdata", "services.yaml")

type matrixFile struct {
	Clusters []matrixCluster `json:"clusters"`
	Cases    []matrixCase    `json:"cases"`
}

// matrixCluster is one cluster shape: its --service-cluster-ip-range, primary first.
type matrixCluster struct {
	Name   string   `json:"name"`
	Ranges []string `json:"ranges"`
}

// matrixSpec is the ClusterIP part of a Service spec. In a create, a nil field is unset. In an
// update, a nil field keeps the created Service's value, and "$0"/"$1" in clusterIP(s) stand for
// the created Service's clusterIPs[0]/[1].
type matrixSpec struct {
	Type           corev1.ServiceType `json:"type,omitempty"`
	NoSelector     bool               `json:"noSelector,omitempty"`
	IPFamilyPolicy *string            `json:"ipFamilyPolicy,omitempty"`
	IPFamilies     *[]string          `json:"ipFamilies,omitempty"`
	ClusterIP      *string            `json:"clusterIP,omitempty"`
	ClusterIPs     *[]string          `json:"clusterIPs,omitempty"`
}

type matrixCase struct {
	Name   string                  `json:"name"`
	Taken  []string                `json:"taken,omitempty"`
	Create matrixSpec              `json:"create"`
	Update *matrixSpec             `json:"update,omitempty"`
	Expect map[string]matrixExpect `json:"expect,omitempty"`
}

type matrixExpect struct {
	Create matrixResult  `json:"create"`
	Update *matrixResult `json:"update,omitempty"`
}

// matrixResult is a Service's ClusterIP fields after the call, or its error. In clusterIPs a
// literal address is one the case chose, "$0"/"$1" the created Service's, "IPv4"/"IPv6" a fresh
// address of that family from the cluster's range, and "None" itself.
type matrixResult struct {
	ClusterIPs     []string     `json:"clusterIPs,omitempty"`
	IPFamilies     []string     `json:"ipFamilies,omitempty"`
	IPFamilyPolicy string       `json:"ipFamilyPolicy,omitempty"`
	Error          *matrixError `json:"error,omitempty"`
}

type matrixError struct {
	Code   int32         `json:"code"`
	Reason string        `json:"reason"`
	Causes []matrixCause `json:"causes,omitempty"`
}

type matrixCause struct {
	Field string `json:"field"`
	Type  string `json:"type"`
}

func loadMatrix(t testing.TB) *matrixFile {
	t.Helper()
	data, err := os.ReadFile(matrixPath)
	if err != nil {
		t.Fatalf("read matrix: %v", err)
	}
	var m matrixFile
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		t.Fatalf("parse %s: %v", matrixPath, err)
	}
	if len(m.Clusters) == 0 || len(m.Cases) == 0 {
		t.Fatalf("%s: no clusters or no cases", matrixPath)
	}
	return &m
}

// clusterRanges parses a cluster's ranges; the primary family is the first range's.
func clusterRanges(t testing.TB, c matrixCluster) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, r := range c.Ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			t.Fatalf("cluster %s: %v", c.Name, err)
		}
		out = append(out, p)
	}
	return out
}

// matrixService builds the Service a case creates: one TCP port, a selector unless the case has
// none, and an external name for ExternalName.
func matrixService(name string, s matrixSpec) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:  s.Type,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if !s.NoSelector {
		svc.Spec.Selector = map[string]string{"app": name}
	}
	applySpec(svc, s, nil)
	return svc
}

// applySpec sets the ClusterIP fields s gives, replacing "$i" with created's clusterIPs[i].
func applySpec(svc *corev1.Service, s matrixSpec, created *corev1.Service) {
	sub := func(v string) string {
		if created != nil && strings.HasPrefix(v, "$") {
			var i int
			if _, err := fmt.Sscanf(v, "$%d", &i); err == nil && i < len(created.Spec.ClusterIPs) {
				return created.Spec.ClusterIPs[i]
			}
		}
		return v
	}
	if s.Type != "" {
		svc.Spec.Type = s.Type
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		svc.Spec.ExternalName = "example.com"
	} else {
		svc.Spec.ExternalName = ""
	}
	if s.IPFamilyPolicy != nil {
		if *s.IPFamilyPolicy == "" {
			svc.Spec.IPFamilyPolicy = nil
		} else {
			p := corev1.IPFamilyPolicy(*s.IPFamilyPolicy)
			svc.Spec.IPFamilyPolicy = &p
		}
	}
	if s.IPFamilies != nil {
		svc.Spec.IPFamilies = nil
		for _, f := range *s.IPFamilies {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, corev1.IPFamily(f))
		}
	}
	if s.ClusterIP != nil {
		svc.Spec.ClusterIP = sub(*s.ClusterIP)
	}
	if s.ClusterIPs != nil {
		svc.Spec.ClusterIPs = nil
		for _, v := range *s.ClusterIPs {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, sub(v))
		}
	}
}

// literals returns the addresses a spec names literally.
func literals(s *matrixSpec) []string {
	if s == nil {
		return nil
	}
	var out []string
	if s.ClusterIP != nil {
		out = append(out, *s.ClusterIP)
	}
	if s.ClusterIPs != nil {
		out = append(out, *s.ClusterIPs...)
	}
	return out
}

// resultOf turns a Service, or the error of the call that made it, into a matrixResult. It fails
// t when a fresh address is outside the cluster's range or clusterIP is not clusterIPs[0].
func resultOf(t testing.TB, tc matrixCase, ranges []netip.Prefix, svc, created *corev1.Service, err error) matrixResult {
	t.Helper()
	if err != nil {
		var se *apierrors.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("error %v is a %T, want a *errors.StatusError", err, err)
		}
		st := se.Status()
		me := &matrixError{Code: st.Code, Reason: string(st.Reason)}
		if st.Details != nil {
			for _, c := range st.Details.Causes {
				if c.Field == "" {
					continue
				}
				me.Causes = append(me.Causes, matrixCause{Field: c.Field, Type: string(c.Type)})
			}
		}
		return matrixResult{Error: me}
	}
	var r matrixResult
	lits := append(literals(&tc.Create), literals(tc.Update)...)
	for _, ip := range svc.Spec.ClusterIPs {
		r.ClusterIPs = append(r.ClusterIPs, symbolOf(t, ip, lits, ranges, created))
	}
	for _, f := range svc.Spec.IPFamilies {
		r.IPFamilies = append(r.IPFamilies, string(f))
	}
	if svc.Spec.IPFamilyPolicy != nil {
		r.IPFamilyPolicy = string(*svc.Spec.IPFamilyPolicy)
	}
	want := ""
	if len(svc.Spec.ClusterIPs) > 0 {
		want = svc.Spec.ClusterIPs[0]
	}
	if svc.Spec.ClusterIP != want {
		t.Errorf("spec.clusterIP = %q, want clusterIPs[0] %q", svc.Spec.ClusterIP, want)
	}
	return r
}

// symbolOf names an address of a result as the matrix does.
func symbolOf(t testing.TB, ip string, lits []string, ranges []netip.Prefix, created *corev1.Service) string {
	t.Helper()
	if ip == corev1.ClusterIPNone {
		return ip
	}
	if created != nil {
		for i, v := range created.Spec.ClusterIPs {
			if v == ip {
				return fmt.Sprintf("$%d", i)
			}
		}
	}
	for _, v := range lits {
		if v == ip {
			return ip
		}
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		t.Errorf("allocated address %q does not parse", ip)
		return ip
	}
	for _, p := range ranges {
		if p.Contains(a) {
			if a.Is4() {
				return string(corev1.IPv4Protocol)
			}
			return string(corev1.IPv6Protocol)
		}
	}
	t.Errorf("allocated address %s is in none of the ranges %v", ip, ranges)
	return ip
}

// writeMatrix writes m as YAML, one line per spec and result, with a header pointing at the
// README. YAML is a superset of JSON, so each line is a JSON object.
func writeMatrix(m *matrixFile, source string) error {
	var b bytes.Buffer
	line := func(v any) string {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			panic(err) // only plain structs are marshaled
		}
		return strings.TrimSuffix(buf.String(), "\n")
	}
	b.WriteString("# The Service ClusterIP matrix: see README.md in this folder for the schema.\n")
	b.WriteString("# Expectations recorded from " + source + ".\n")
	b.WriteString("# Regenerate: go test ./allocator -run TestServiceMatrixKubeAPIServer -update-matrix\n")
	b.WriteString("clusters:\n")
	for _, c := range m.Clusters {
		fmt.Fprintf(&b, "  - %s\n", line(c))
	}
	b.WriteString("cases:\n")
	for _, c := range m.Cases {
		fmt.Fprintf(&b, "  - name: %s\n", line(c.Name))
		if len(c.Taken) > 0 {
			fmt.Fprintf(&b, "    taken: %s\n", line(c.Taken))
		}
		fmt.Fprintf(&b, "    create: %s\n", line(c.Create))
		if c.Update != nil {
			fmt.Fprintf(&b, "    update: %s\n", line(c.Update))
		}
		b.WriteString("    expect:\n")
		for _, cl := range m.Clusters {
			e, ok := c.Expect[cl.Name]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "      %s:\n", cl.Name)
			fmt.Fprintf(&b, "        create: %s\n", line(e.Create))
			if e.Update != nil {
				fmt.Fprintf(&b, "        update: %s\n", line(e.Update))
			}
		}
	}
	return os.WriteFile(matrixPath, b.Bytes(), 0o644)
}
