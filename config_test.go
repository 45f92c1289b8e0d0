package clusterip

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-ipam/clusterip/allocator"
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
		{name: "no ranges", cfg: Config{Etcd: etcd}, field: "Ranges"},
		{name: "three ranges", cfg: Config{Etcd: etcd, Ranges: []netip.Prefix{v4[0], netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.0.0.0/24")}}, field: "Ranges"},
		{name: "two IPv4 ranges", cfg: Config{Etcd: etcd, Ranges: []netip.Prefix{v4[0], netip.MustParsePrefix("10.0.0.0/24")}}, field: "Ranges[1]"},
		{name: "host bits set", cfg: Config{Etcd: etcd, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.1/24")}}, field: "Ranges[0]"},
		{name: "a /32", cfg: Config{Etcd: etcd, Ranges: []netip.Prefix{netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.0.0.1/32")}}, field: "Ranges[1]"},
		{name: "unknown mode", cfg: Config{Mode: 9, Etcd: etcd, Ranges: v4}, field: "Mode"},
		{name: "Legacy without etcd", cfg: Config{Mode: featuregate.Legacy, Ranges: v4}, field: "Etcd"},
		{name: "DualWrite without etcd", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Client: client, Informers: inf}, field: "Etcd"},
		{name: "DualWrite without client", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Etcd: etcd, Informers: inf}, field: "Client"},
		{name: "DualWrite without informers", cfg: Config{Mode: featuregate.DualWrite, Ranges: v4, Etcd: etcd, Client: client}, field: "Informers"},
		{name: "IPAddressOnly without client", cfg: Config{Mode: featuregate.IPAddressOnly, Ranges: v4, Informers: inf}, field: "Client"},
		{name: "IPAddressOnly without informers", cfg: Config{Mode: featuregate.IPAddressOnly, Ranges: v4, Client: client}, field: "Informers"},
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
	if a.Family("IPv4") == nil || a.Family("IPv6") == nil || a.Family("other") != nil {
		t.Errorf("Family() = %v, %v, %v; want two allocators and nil", a.Family("IPv4"), a.Family("IPv6"), a.Family("other"))
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
		{flag: "10.96.0.1/12", wantErr: true, invalid: true},
		{flag: "10.96.0.0/12,10.0.0.0/8", wantErr: true},
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
