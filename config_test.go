package clusterip

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/compatibility"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
)

func TestNewNamesTheMissingField(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	inf := informers.NewSharedInformerFactory(client, 0)
	etcd := &clientv3.Client{} // never dialled: New fails before it is used
	v4 := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{name: "no ranges", cfg: Config{Bitmaps: etcdstore.Stores{Client: etcd}}, field: "Ranges"},
		{name: "three ranges", cfg: Config{Bitmaps: etcdstore.Stores{Client: etcd}, Ranges: []netip.Prefix{v4[0], netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.0.0.0/24")}}, field: "Ranges"},
		{name: "two IPv4 ranges", cfg: Config{Bitmaps: etcdstore.Stores{Client: etcd}, Ranges: []netip.Prefix{v4[0], netip.MustParsePrefix("10.0.0.0/24")}}, field: "Ranges[1]"},
		{name: "host bits set", cfg: Config{Bitmaps: etcdstore.Stores{Client: etcd}, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.1/24")}}, field: "Ranges[0]"},
		{name: "a /32", cfg: Config{Bitmaps: etcdstore.Stores{Client: etcd}, Ranges: []netip.Prefix{netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.0.0.1/32")}}, field: "Ranges[1]"},
		{name: "unknown mode", cfg: Config{Mode: 9, Bitmaps: etcdstore.Stores{Client: etcd}, Ranges: v4}, field: "Mode"},
		{name: "Legacy without bitmaps", cfg: Config{Mode: featuregate.Legacy, Ranges: v4}, field: "Bitmaps"},
		{name: "DualWrite without bitmaps", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Client: client, Informers: inf}, field: "Bitmaps"},
		{name: "DualWrite without client", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Bitmaps: etcdstore.Stores{Client: etcd}, Informers: inf}, field: "Client"},
		{name: "DualWrite without informers", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Bitmaps: etcdstore.Stores{Client: etcd}, Client: client}, field: "Informers"},
		{name: "IPAddressOnly without client", cfg: Config{Mode: featuregate.IPAddressOnly, Ranges: v4, Informers: inf}, field: "Client"},
		{name: "IPAddressOnly without informers", cfg: Config{Mode: featuregate.IPAddressOnly, Ranges: v4, Client: client}, field: "Informers"},
		{name: "Legacy with DefaultServiceCIDR", cfg: Config{Mode: featuregate.Legacy, Ranges: v4, Bitmaps: etcdstore.Stores{Client: etcd}, DefaultServiceCIDR: true}, field: "DefaultServiceCIDR"},
		{name: "DualWrite with Reservations", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Bitmaps: etcdstore.Stores{Client: etcd}, Client: client, Informers: inf, Reservations: true}, field: "Reservations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(context.Background(), tt.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("New() = %v, %v; want a *ConfigError", a, err)
			}
			if ce.Field != tt.field {
				t.Errorf("New() error names field %q, want %q (%v)", ce.Field, tt.field, err)
			}
		})
	}
}

func TestValidateChecksRangesAndModeOnly(t *testing.T) {
	v4 := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	tests := []struct {
		name  string
		cfg   Config
		field string // "" for nil
	}{
		{name: "no clients", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4}},
		{name: "a range too large for a bitmap", cfg: Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("fd00::/64")}}},
		{name: "no ranges", cfg: Config{}, field: "Ranges"},
		{name: "two IPv4 ranges", cfg: Config{Ranges: []netip.Prefix{v4[0], netip.MustParsePrefix("10.0.0.0/24")}}, field: "Ranges[1]"},
		{name: "a primary of 4 addresses", cfg: Config{Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/30")}}, field: "Ranges[0]"},
		{name: "unknown mode", cfg: Config{Mode: 9, Ranges: v4}, field: "Mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Errorf("Validate() = %v, want a *ConfigError naming %q", err, tt.field)
			}
		})
	}
}

func TestNewIPAddressOnlyNeedsNoEtcd(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	inf := informers.NewSharedInformerFactory(client, 0)
	a, err := New(context.Background(), Config{
		Mode:      featuregate.IPAddressOnly,
		Ranges:    []netip.Prefix{netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.96.0.0/12")},
		Client:    client,
		Informers: inf,
	})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	defer a.Close()
	if got, want := a.Families(), []string{"IPv6", "IPv4"}; len(got) != 2 || string(got[0]) != want[0] || string(got[1]) != want[1] {
		t.Errorf("Families() = %v, want %v", got, want)
	}
	if a.For("IPv4") == nil || a.For("IPv6") == nil || a.For("other") != nil {
		t.Errorf("For() = %v, %v, %v; want two allocators and nil", a.For("IPv4"), a.For("IPv6"), a.For("other"))
	}
	if a.Bitmap("IPv4") != nil {
		t.Error("Bitmap(IPv4) in IPAddressOnly mode != nil")
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	if err := a.Run(context.Background()); err == nil {
		t.Error("Run() after Close = nil, want an error")
	}
}

func TestParseRanges(t *testing.T) {
	tests := []struct {
		flag    string
		want    []netip.Prefix
		wantErr bool
		invalid bool // the error matches allocator.ErrInvalid
	}{
		{flag: "10.96.0.0/12", want: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
		{flag: "10.96.0.0/12, fd00::/108", want: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00::/108")}},
		{flag: "fd00::/108,10.96.0.0/12", want: []netip.Prefix{netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.96.0.0/12")}},
		{flag: "", wantErr: true, invalid: true},
		{flag: "10.96.0.0", wantErr: true, invalid: true},
		// kube-apiserver reads the flag with ParseCIDRSloppy and serves the network: host bits
		// and leading zeros are taken.
		{flag: "10.96.0.1/12", want: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
		{flag: "010.096.0.0/12,fd00::1/108", want: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00::/108")}},
		{flag: "10.96.0.0/33", wantErr: true, invalid: true},
		{flag: "::ffff:10.96.0.0/108", wantErr: true, invalid: true},
		{flag: "10.96.0.0/12,10.0.0.0/8", wantErr: true},
		// kube-apiserver v1.33 refuses a primary range of fewer than 8 addresses, in every mode
		// ("the service cluster IP range must be at least 8 IP addresses"); not a secondary one.
		{flag: "10.96.0.0/29", want: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/29")}},
		{flag: "10.96.0.0/30", wantErr: true},
		{flag: "fd00::/126", wantErr: true},
		{flag: "fd00::/125,10.96.0.0/30", want: []netip.Prefix{netip.MustParsePrefix("fd00::/125"), netip.MustParsePrefix("10.96.0.0/30")}},
	}
	for _, tt := range tests {
		t.Run(tt.flag, func(t *testing.T) {
			got, err := ParseRanges(tt.flag)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseRanges(%q) = %v, %v; want error %t", tt.flag, got, err, tt.wantErr)
			}
			if err != nil {
				var ce *ConfigError
				if !errors.As(err, &ce) {
					t.Errorf("ParseRanges(%q) error %v is not a *ConfigError", tt.flag, err)
				}
				if errors.Is(err, allocator.ErrInvalid) != tt.invalid {
					t.Errorf("ParseRanges(%q) error %v: matches ErrInvalid = %t, want %t", tt.flag, err, !tt.invalid, tt.invalid)
				}
				return
			}
			if len(got) != len(tt.want) || got[0] != tt.want[0] || (len(got) == 2 && got[1] != tt.want[1]) {
				t.Errorf("ParseRanges(%q) = %v, want %v", tt.flag, got, tt.want)
			}
		})
	}
}

// TestNewRefusesRangesKubeAPIServerRefuses checks kube-apiserver's start-up rules for
// --service-cluster-ip-range, v1.33 to v1.38. In every mode the primary range must have at least 8
// addresses (pkg/controlplane/apiserver/options.ServiceIPRange). Up to v1.37, unless
// MultiCIDRServiceAllocator and DisableAllocatorDualWrite are both on, each range may have at most
// 20 host bits, an IPv4 /12 or an IPv6 /108, because its bitmap is kept in etcd
// (cmd/kube-apiserver/app/options/validation.go); v1.38 removed that check with the bitmaps.
// New refuses the same ranges with kube-apiserver's message, naming the field; IPAddressOnly keeps
// no bitmap and takes wide ranges, as kube-apiserver does.
func TestNewRefusesRangesKubeAPIServerRefuses(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	inf := informers.NewSharedInformerFactory(client, 0)
	etcd := &clientv3.Client{} // never dialled: New fails before it is used
	ranges := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, r := range s {
			out = append(out, netip.MustParsePrefix(r))
		}
		return out
	}
	v138, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "")
	if err != nil {
		t.Fatal(err)
	}
	v138at135, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "1.35")
	if err != nil {
		t.Fatal(err)
	}
	v138at137, err := featuregate.KubeVersion(featuregate.NewestKubeVersion, "1.37")
	if err != nil {
		t.Fatal(err)
	}
	v137, err := featuregate.KubeVersion("1.37.2", "")
	if err != nil {
		t.Fatal(err)
	}
	v137at134, err := featuregate.KubeVersion("1.37.2", "1.34")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mode    featuregate.Mode
		version compatibility.EffectiveVersion // nil for the Mode's default
		ranges  []netip.Prefix
		field   string // "" if New must accept the ranges
		reason  string
	}{
		{name: "Legacy IPv6 /107", mode: featuregate.Legacy, ranges: ranges("fd00::/107"), field: "Ranges[0]",
			reason: "specified --service-cluster-ip-range is too large; for 128-bit addresses, the mask must be >= 108"},
		{name: "Legacy IPv6 /64 secondary", mode: featuregate.Legacy, ranges: ranges("10.96.0.0/12", "fd00::/64"), field: "Ranges[1]",
			reason: "specified --service-cluster-ip-range[1] is too large; for 128-bit addresses, the mask must be >= 108"},
		{name: "Legacy IPv4 /11", mode: featuregate.Legacy, ranges: ranges("10.96.0.0/11"), field: "Ranges[0]",
			reason: "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12"},
		{name: "DualWrite IPv6 /64", mode: featuregate.DualWrite, ranges: ranges("fd00::/64"), field: "Ranges[0]",
			reason: "specified --service-cluster-ip-range is too large; for 128-bit addresses, the mask must be >= 108"},
		{name: "DualWrite IPv4 /8 secondary", mode: featuregate.DualWrite, ranges: ranges("fd00::/108", "10.0.0.0/8"), field: "Ranges[1]",
			reason: "specified --service-cluster-ip-range[1] is too large; for 32-bit addresses, the mask must be >= 12"},
		{name: "IPAddressOnly IPv6 /64 and IPv4 /8", mode: featuregate.IPAddressOnly, ranges: ranges("fd00::/64", "10.0.0.0/8")},
		{name: "IPAddressOnly IPv6 /48", mode: featuregate.IPAddressOnly, ranges: ranges("fd00::/48")},
		{name: "IPAddressOnly primary of 4 addresses", mode: featuregate.IPAddressOnly, ranges: ranges("10.0.0.0/30"), field: "Ranges[0]",
			reason: "the service cluster IP range must be at least 8 IP addresses"},
		{name: "Legacy primary of 4 addresses", mode: featuregate.Legacy, ranges: ranges("fd00::/126", "10.0.0.0/24"), field: "Ranges[0]",
			reason: "the service cluster IP range must be at least 8 IP addresses"},
		// v1.38 keeps no bitmap: no 20-bit limit, only the 8-address floor of the primary.
		{name: "v1.38 IPv4 /8", mode: featuregate.IPAddressOnly, version: v138, ranges: ranges("10.0.0.0/8")},
		{name: "v1.38 IPv4 /11 and IPv6 /64", mode: featuregate.IPAddressOnly, version: v138, ranges: ranges("10.96.0.0/11", "fd00::/64")},
		{name: "v1.38 IPv6 /48 primary", mode: featuregate.IPAddressOnly, version: v138, ranges: ranges("fd00::/48", "10.0.0.0/8")},
		{name: "v1.38 emulating 1.35 IPv4 /8", mode: featuregate.IPAddressOnly, version: v138at135, ranges: ranges("10.0.0.0/8")},
		{name: "v1.38 primary of 4 addresses", mode: featuregate.IPAddressOnly, version: v138, ranges: ranges("10.0.0.0/30"), field: "Ranges[0]",
			reason: "the service cluster IP range must be at least 8 IP addresses"},
		{name: "v1.38 IPv6 primary of 4 addresses", mode: featuregate.IPAddressOnly, version: v138, ranges: ranges("fd00::/126", "10.0.0.0/8"), field: "Ranges[0]",
			reason: "the service cluster IP range must be at least 8 IP addresses"},
		// v1.37.2 keeps the 20-bit check, which holds only while a bitmap is kept: its DualWrite
		// (emulating 1.34) refuses a /8 and a /11, its default IPAddressOnly takes them. A v1.38
		// binary emulating 1.37 has no such check at all.
		{name: "v1.37 DualWrite IPv4 /8", mode: featuregate.DualWrite, version: v137at134, ranges: ranges("10.0.0.0/8"), field: "Ranges[0]",
			reason: "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12"},
		{name: "v1.37 DualWrite IPv4 /11 secondary", mode: featuregate.DualWrite, version: v137at134, ranges: ranges("fd00::/108", "10.96.0.0/11"), field: "Ranges[1]",
			reason: "specified --service-cluster-ip-range[1] is too large; for 32-bit addresses, the mask must be >= 12"},
		{name: "v1.37 IPAddressOnly IPv4 /8", mode: featuregate.IPAddressOnly, version: v137, ranges: ranges("10.0.0.0/8")},
		{name: "v1.38 emulating 1.37 IPv4 /8", mode: featuregate.IPAddressOnly, version: v138at137, ranges: ranges("10.0.0.0/8")},
		// Asking v1.38 for a bitmap mode is refused for the mode, before any range is looked at.
		{name: "v1.38 Legacy IPv4 /8", mode: featuregate.Legacy, version: v138, ranges: ranges("10.0.0.0/8"), field: "Mode",
			reason: "does not run mode Legacy"},
		{name: "v1.38 DualWrite IPv4 /12", mode: featuregate.DualWrite, version: v138at135, ranges: ranges("10.96.0.0/12"), field: "Mode",
			reason: "does not run mode DualWrite"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Mode: tt.mode, Version: tt.version, Ranges: tt.ranges, Bitmaps: etcdstore.Stores{Client: etcd}, Client: client, Informers: inf}
			if tt.mode == featuregate.IPAddressOnly {
				cfg.Bitmaps = nil
			}
			a, err := New(context.Background(), cfg)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("New(%v, %v) = %v, want nil", tt.mode, tt.ranges, err)
				}
				a.Close()
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("New(%v, %v) = %v, %v; want a *ConfigError", tt.mode, tt.ranges, a, err)
			}
			if ce.Field != tt.field || !strings.Contains(ce.Reason, tt.reason) {
				t.Errorf("New(%v, %v) error = %v; want field %s and a reason saying %q", tt.mode, tt.ranges, err, tt.field, tt.reason)
			}
		})
	}
}
