package service_test

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The inputs of testdata/services-<release>.yaml. TestServiceMatrixKubeAPIServer -update-matrix runs them
// against real kube-apiservers and rewrites the file with what they answered; everything else
// reads the file.

// matrixClusters are the four cluster shapes. The IPv4 range is a /16 and the IPv6 one a /112 so
// that every case can choose addresses no other case used.
var matrixClusters = []matrixCluster{
	{Name: "ipv4", Ranges: []string{"10.96.0.0/16"}},
	{Name: "ipv6", Ranges: []string{"fd00:10:96::/112"}},
	{Name: "dual-ipv4-first", Ranges: []string{"10.96.0.0/16", "fd00:10:96::/112"}},
	{Name: "dual-ipv6-first", Ranges: []string{"fd00:10:96::/112", "10.96.0.0/16"}},
}

func strp(s string) *string { return &s }

func listp(s ...string) *[]string {
	if s == nil {
		s = []string{}
	}
	return &s
}

// ipSeq hands out addresses no other case chose, so that cases never wait on each other's
// releases.
type ipSeq struct{ n int }

func (s *ipSeq) v4() string {
	s.n++
	return fmt.Sprintf("10.96.%d.%d", 1+s.n/250, 2+s.n%250)
}

func (s *ipSeq) v6() string {
	s.n++
	return fmt.Sprintf("fd00:10:96::%x", 0x1000+s.n)
}

// inStaticBand moves ip, an address of ipSeq, into the static band of 10.96.0.0/16
// (10.96.0.1-10.96.1.0), which AllocateNext leaves alone while the dynamic band has room. A case
// that changes a Service's ClusterIP, picked at random from the dynamic band, to a chosen one asks
// for such an address: one of ipSeq's could be the Service's own, and the update no change.
func inStaticBand(ip string) string {
	return "10.96.0." + ip[strings.LastIndexByte(ip, '.')+1:]
}

func describe(p *string) string {
	if p == nil {
		return "unset"
	}
	return *p
}

func describeList(l *[]string) string {
	if l == nil {
		return "unset"
	}
	return "[" + strings.Join(*l, ",") + "]"
}

// matrixInputs returns every case, without expectations.
func matrixInputs() []matrixCase {
	var seq ipSeq
	var cases []matrixCase
	add := func(name string, c matrixCase) {
		c.Name = name
		cases = append(cases, c)
	}
	policies := []*string{nil, strp("SingleStack"), strp("PreferDualStack"), strp("RequireDualStack")}
	families := []*[]string{nil, listp("IPv4"), listp("IPv6"), listp("IPv4", "IPv6"), listp("IPv6", "IPv4")}

	// Create: type ClusterIP, every policy × families × chosen addresses, headless with and
	// without a selector.
	for _, pol := range policies {
		for _, fam := range families {
			for _, ipsKind := range []string{"unset", "v4", "v6", "v4,v6", "v6,v4", "None", "None/no-selector"} {
				spec := matrixSpec{Type: "ClusterIP", IPFamilyPolicy: pol, IPFamilies: fam}
				var ips []string
				switch ipsKind {
				case "v4":
					ips = []string{seq.v4()}
				case "v6":
					ips = []string{seq.v6()}
				case "v4,v6":
					ips = []string{seq.v4(), seq.v6()}
				case "v6,v4":
					ips = []string{seq.v6(), seq.v4()}
				case "None", "None/no-selector":
					ips = []string{"None"}
					spec.NoSelector = ipsKind == "None/no-selector"
				}
				if ips != nil {
					spec.ClusterIP = strp(ips[0])
					spec.ClusterIPs = listp(ips...)
				}
				add(fmt.Sprintf("create/ClusterIP/policy=%s/families=%s/clusterIPs=%s", describe(pol), describeList(fam), ipsKind),
					matrixCase{Create: spec})
			}
		}
	}

	// Create: NodePort and LoadBalancer, every policy × families, plus a chosen address and "None".
	for _, typ := range []string{"NodePort", "LoadBalancer"} {
		for _, pol := range policies {
			for _, fam := range families {
				add(fmt.Sprintf("create/%s/policy=%s/families=%s/clusterIPs=unset", typ, describe(pol), describeList(fam)),
					matrixCase{Create: matrixSpec{Type: corev1ServiceType(typ), IPFamilyPolicy: pol, IPFamilies: fam}})
			}
		}
		ip := seq.v4()
		add(fmt.Sprintf("create/%s/policy=SingleStack/families=unset/clusterIPs=v4", typ), matrixCase{Create: matrixSpec{
			Type: corev1ServiceType(typ), IPFamilyPolicy: strp("SingleStack"), ClusterIP: strp(ip), ClusterIPs: listp(ip)}})
		ip6, ip4 := seq.v6(), seq.v4()
		add(fmt.Sprintf("create/%s/policy=RequireDualStack/families=unset/clusterIPs=v6,v4", typ), matrixCase{Create: matrixSpec{
			Type: corev1ServiceType(typ), IPFamilyPolicy: strp("RequireDualStack"), ClusterIP: strp(ip6), ClusterIPs: listp(ip6, ip4)}})
		add(fmt.Sprintf("create/%s/clusterIPs=None", typ), matrixCase{Create: matrixSpec{
			Type: corev1ServiceType(typ), ClusterIP: strp("None"), ClusterIPs: listp("None")}})
	}

	// Create: ExternalName gets nothing, and may not ask for anything.
	ext := corev1ServiceType("ExternalName")
	add("create/ExternalName", matrixCase{Create: matrixSpec{Type: ext}})
	ip := seq.v4()
	add("create/ExternalName/clusterIPs=v4", matrixCase{Create: matrixSpec{Type: ext, ClusterIP: strp(ip), ClusterIPs: listp(ip)}})
	add("create/ExternalName/clusterIPs=None", matrixCase{Create: matrixSpec{Type: ext, ClusterIP: strp("None"), ClusterIPs: listp("None")}})
	add("create/ExternalName/families=[IPv4]", matrixCase{Create: matrixSpec{Type: ext, IPFamilies: listp("IPv4")}})
	add("create/ExternalName/policy=SingleStack", matrixCase{Create: matrixSpec{Type: ext, IPFamilyPolicy: strp("SingleStack")}})

	// Create: malformed requests.
	ip = seq.v4()
	add("create/ClusterIP/old-client/clusterIP-only=v4", matrixCase{Create: matrixSpec{ClusterIP: strp(ip)}})
	ip6 := seq.v6()
	add("create/ClusterIP/old-client/clusterIP-only=v6", matrixCase{Create: matrixSpec{ClusterIP: strp(ip6)}})
	a, b := seq.v4(), seq.v4()
	add("create/ClusterIP/clusterIP-differs-from-clusterIPs[0]", matrixCase{Create: matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(b)}})
	ip = seq.v4()
	add("create/ClusterIP/clusterIPs-without-clusterIP", matrixCase{Create: matrixSpec{ClusterIPs: listp(ip)}})
	add("create/ClusterIP/clusterIPs=not-an-IP", matrixCase{Create: matrixSpec{ClusterIP: strp("10.96.1.300"), ClusterIPs: listp("10.96.1.300")}})
	a, b, c := seq.v4(), seq.v6(), seq.v4()
	add("create/ClusterIP/clusterIPs=three", matrixCase{Create: matrixSpec{IPFamilyPolicy: strp("RequireDualStack"),
		ClusterIP: strp(a), ClusterIPs: listp(a, b, c)}})
	a, b = seq.v4(), seq.v4()
	add("create/ClusterIP/clusterIPs=two-IPv4", matrixCase{Create: matrixSpec{IPFamilyPolicy: strp("RequireDualStack"),
		ClusterIP: strp(a), ClusterIPs: listp(a, b)}})
	a = seq.v4()
	add("create/ClusterIP/clusterIPs=[v4,None]", matrixCase{Create: matrixSpec{IPFamilyPolicy: strp("PreferDualStack"),
		ClusterIP: strp(a), ClusterIPs: listp(a, "None")}})
	add("create/ClusterIP/families=[IPv4,IPv4]", matrixCase{Create: matrixSpec{IPFamilyPolicy: strp("RequireDualStack"), IPFamilies: listp("IPv4", "IPv4")}})
	add("create/ClusterIP/families=[IPv5]", matrixCase{Create: matrixSpec{IPFamilies: listp("IPv5")}})
	add("create/ClusterIP/policy=Bogus", matrixCase{Create: matrixSpec{IPFamilyPolicy: strp("Bogus")}})

	// Create: chosen addresses that are taken or outside the range.
	a = seq.v4()
	add("create/ClusterIP/clusterIPs=v4-taken", matrixCase{Taken: []string{a}, Create: matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a = seq.v6()
	add("create/ClusterIP/clusterIPs=v6-taken", matrixCase{Taken: []string{a}, Create: matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a, b = seq.v4(), seq.v6()
	add("create/ClusterIP/RequireDualStack/clusterIPs=v4,v6-taken", matrixCase{Taken: []string{b},
		Create: matrixSpec{IPFamilyPolicy: strp("RequireDualStack"), ClusterIP: strp(a), ClusterIPs: listp(a, b)}})
	a, b = seq.v6(), seq.v4()
	add("create/ClusterIP/RequireDualStack/clusterIPs=v6,v4-taken", matrixCase{Taken: []string{b},
		Create: matrixSpec{IPFamilyPolicy: strp("RequireDualStack"), ClusterIP: strp(a), ClusterIPs: listp(a, b)}})
	for _, out := range []string{"10.97.0.5", "fd00:10:97::5", "10.96.0.0", "10.96.255.255", "fd00:10:96::"} {
		add("create/ClusterIP/clusterIPs="+out+"-not-allocatable", matrixCase{Create: matrixSpec{ClusterIP: strp(out), ClusterIPs: listp(out)}})
	}

	// Create: chosen addresses in the spellings kube-apiserver v1.33 accepts besides the canonical
	// ones (StrictIPCIDRValidation off, its default). It keeps them as written, judges an
	// IPv4-mapped address IPv4, and allocates the parsed address.
	for _, sp := range []struct {
		name string
		ip   func() string
	}{
		{"v4-leading-zero", func() string { return leadingZero(seq.v4()) }},
		{"v4-mapped-v6", func() string { return "::ffff:" + seq.v4() }},
		{"v6-upper-case", func() string { return strings.ToUpper(seq.v6()) }},
		{"v6-uncompressed", func() string { return uncompressed(seq.v6()) }},
	} {
		a = sp.ip()
		add("create/ClusterIP/spelling="+sp.name, matrixCase{Create: matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	}
	a = "::ffff:" + seq.v4()
	add("create/ClusterIP/spelling=v4-mapped-v6/families=[IPv6]", matrixCase{Create: matrixSpec{
		IPFamilies: listp("IPv6"), ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a, b = strings.ToUpper(seq.v6()), leadingZero(seq.v4())
	add("create/ClusterIP/spelling/RequireDualStack/clusterIPs=v6-upper-case,v4-leading-zero", matrixCase{Create: matrixSpec{
		IPFamilyPolicy: strp("RequireDualStack"), ClusterIP: strp(a), ClusterIPs: listp(a, b)}})
	a, b = "::ffff:"+seq.v4(), seq.v6()
	add("create/ClusterIP/spelling/RequireDualStack/clusterIPs=v4-mapped-v6,v6", matrixCase{Create: matrixSpec{
		IPFamilyPolicy: strp("RequireDualStack"), ClusterIP: strp(a), ClusterIPs: listp(a, b)}})
	a = seq.v4()
	add("create/ClusterIP/spelling=v4-leading-zero/taken-as-canonical", matrixCase{Taken: []string{a},
		Create: matrixSpec{ClusterIP: strp(leadingZero(a)), ClusterIPs: listp(leadingZero(a))}})
	a = seq.v6()
	add("create/ClusterIP/spelling=v6-upper-case/taken-as-canonical", matrixCase{Taken: []string{a},
		Create: matrixSpec{ClusterIP: strp(strings.ToUpper(a)), ClusterIPs: listp(strings.ToUpper(a))}})
	add("create/ClusterIP/spelling=v4-leading-zero/not-allocatable", matrixCase{Create: matrixSpec{
		ClusterIP: strp("10.97.0.07"), ClusterIPs: listp("10.97.0.07")}})

	// Update transitions.
	single, prefer, require := strp("SingleStack"), strp("PreferDualStack"), strp("RequireDualStack")
	add("update/upgrade/SingleStack->RequireDualStack", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single}, Update: &matrixSpec{IPFamilyPolicy: require}})
	add("update/upgrade/SingleStack->PreferDualStack", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single}, Update: &matrixSpec{IPFamilyPolicy: prefer}})
	add("update/upgrade/families=[IPv4]->[IPv4,IPv6]", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv4")},
		Update: &matrixSpec{IPFamilyPolicy: require, IPFamilies: listp("IPv4", "IPv6")}})
	add("update/upgrade/families=[IPv6]->[IPv6,IPv4]", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv6")},
		Update: &matrixSpec{IPFamilyPolicy: prefer, IPFamilies: listp("IPv6", "IPv4")}})
	a6 := seq.v6()
	add("update/upgrade/chosen-secondary", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv4")},
		Update: &matrixSpec{IPFamilyPolicy: require, IPFamilies: listp("IPv4", "IPv6"), ClusterIPs: listp("$0", a6)}})
	a6 = seq.v6()
	add("update/upgrade/chosen-secondary-taken", matrixCase{Taken: []string{a6},
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv4")},
		Update: &matrixSpec{IPFamilyPolicy: require, IPFamilies: listp("IPv4", "IPv6"), ClusterIPs: listp("$0", a6)}})
	add("update/upgrade/primary-family-changed", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv4")},
		Update: &matrixSpec{IPFamilyPolicy: require, IPFamilies: listp("IPv6", "IPv4")}})
	add("update/downgrade/RequireDualStack->SingleStack", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilyPolicy: single}})
	add("update/downgrade/PreferDualStack->SingleStack", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{IPFamilyPolicy: single}})
	add("update/downgrade/SingleStack-with-clusterIPs=[$0]", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilyPolicy: single, ClusterIP: strp("$0"), ClusterIPs: listp("$0")}})
	add("update/downgrade/PreferDualStack-with-clusterIPs=[$0]", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilyPolicy: prefer, ClusterIP: strp("$0"), ClusterIPs: listp("$0")}})
	add("update/downgrade/RequireDualStack-with-clusterIPs=[$0]", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{ClusterIP: strp("$0"), ClusterIPs: listp("$0")}})
	add("update/downgrade/keep-secondary-only", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilyPolicy: single, ClusterIP: strp("$1"), ClusterIPs: listp("$1")}})
	add("update/swap-clusterIPs", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{ClusterIP: strp("$1"), ClusterIPs: listp("$1", "$0")}})
	add("update/PreferDualStack/unchanged", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{}})
	add("update/PreferDualStack/client-omits-ipFamilies", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{IPFamilies: listp()}})
	add("update/policy-omitted-keeps-old", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilyPolicy: strp("")}})
	add("update/client-omits-clusterIPs", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{ClusterIP: strp(""), ClusterIPs: listp()}})
	// The ClusterIP these two change to is never the Service's own: see inStaticBand.
	a = inStaticBand(seq.v4())
	add("update/change-clusterIP", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single}, Update: &matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a = inStaticBand(seq.v4())
	add("update/old-client-changes-clusterIP", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single}, Update: &matrixSpec{ClusterIP: strp(a)}})
	add("update/change-families", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: require}, Update: &matrixSpec{IPFamilies: listp("IPv6", "IPv4")}})
	add("update/ClusterIP->ExternalName", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{Type: ext}})
	add("update/ExternalName->ClusterIP", matrixCase{
		Create: matrixSpec{Type: ext}, Update: &matrixSpec{Type: "ClusterIP"}})
	add("update/ExternalName->ClusterIP/RequireDualStack", matrixCase{
		Create: matrixSpec{Type: ext}, Update: &matrixSpec{Type: "ClusterIP", IPFamilyPolicy: require}})
	add("update/ClusterIP->NodePort", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: prefer}, Update: &matrixSpec{Type: "NodePort"}})
	add("update/headless->clusterIPs-omitted", matrixCase{
		Create: matrixSpec{ClusterIP: strp("None"), ClusterIPs: listp("None")}, Update: &matrixSpec{ClusterIP: strp(""), ClusterIPs: listp()}})
	a = seq.v4()
	add("update/headless->ClusterIP", matrixCase{
		Create: matrixSpec{ClusterIP: strp("None"), ClusterIPs: listp("None")}, Update: &matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a = leadingZero(seq.v4())
	add("update/spelling=v4-leading-zero/upgrade", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, ClusterIP: strp(a), ClusterIPs: listp(a)},
		Update: &matrixSpec{IPFamilyPolicy: require}})
	a6 = strings.ToUpper(seq.v6())
	add("update/upgrade/chosen-secondary-v6-upper-case", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, IPFamilies: listp("IPv4")},
		Update: &matrixSpec{IPFamilyPolicy: require, IPFamilies: listp("IPv4", "IPv6"), ClusterIPs: listp("$0", a6)}})
	a = seq.v4()
	add("update/spelling=v4-leading-zero/respelled-canonical", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, ClusterIP: strp(leadingZero(a)), ClusterIPs: listp(leadingZero(a))},
		Update: &matrixSpec{ClusterIP: strp(a), ClusterIPs: listp(a)}})
	a = "::ffff:" + seq.v4()
	add("update/spelling=v4-mapped-v6/->ExternalName", matrixCase{
		Create: matrixSpec{IPFamilyPolicy: single, ClusterIP: strp(a), ClusterIPs: listp(a)},
		Update: &matrixSpec{Type: ext}})
	add("update/headless-selectorless/SingleStack", matrixCase{
		Create: matrixSpec{NoSelector: true, ClusterIP: strp("None"), ClusterIPs: listp("None")}, Update: &matrixSpec{IPFamilyPolicy: single}})
	return cases
}

func corev1ServiceType(s string) corev1.ServiceType { return corev1.ServiceType(s) }

// leadingZero writes the last octet of an IPv4 address with a leading zero: 10.96.1.7 is
// 10.96.1.07, which kube-apiserver v1.33 reads as decimal.
func leadingZero(ip string) string {
	i := strings.LastIndexByte(ip, '.')
	return ip[:i+1] + "0" + ip[i+1:]
}

// uncompressed writes an IPv6 address as eight groups, without "::".
func uncompressed(ip string) string {
	b := netip.MustParseAddr(ip).As16()
	groups := make([]string, 8)
	for i := range groups {
		groups[i] = fmt.Sprintf("%x", uint16(b[2*i])<<8|uint16(b[2*i+1]))
	}
	return strings.Join(groups, ":")
}
