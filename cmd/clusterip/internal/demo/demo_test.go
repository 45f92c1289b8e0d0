package demo

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestBitmapKeyFollowsFlagOrder checks that the demo stores each range's bitmap where
// kube-apiserver does: the first --service-cluster-ip-range at ranges/serviceips even when it is
// IPv6, the second at ranges/secondaryserviceips.
func TestBitmapKeyFollowsFlagOrder(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00:96::/112")
	primary, secondary := etcdstore.ServiceIPsKey(""), etcdstore.SecondaryServiceIPsKey("")
	tests := []struct {
		name   string
		ranges []netip.Prefix
		want   map[string]string // etcd key → the range stored there ("" for none)
	}{
		{"IPv4 only", []netip.Prefix{v4}, map[string]string{primary: v4.String(), secondary: ""}},
		{"IPv6 only", []netip.Prefix{v6}, map[string]string{primary: v6.String(), secondary: ""}},
		{"IPv4 first", []netip.Prefix{v4, v6}, map[string]string{primary: v4.String(), secondary: v6.String()}},
		{"IPv6 first", []netip.Prefix{v6, v4}, map[string]string{primary: v6.String(), secondary: v4.String()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			client := etcd.TestClient(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var out bytes.Buffer
			err := Run(ctx, Options{Ranges: tt.ranges, Count: 20, Workers: 1, EtcdEndpoints: etcd.Endpoints(), Out: &out})
			if err != nil {
				t.Fatalf("Run() = %v\n%s", err, out.String())
			}
			got := map[string]string{}
			for key := range tt.want {
				snap, _, err := etcdstore.New(client, key).Get(ctx) // the zero Snapshot if absent
				if err != nil {
					t.Fatalf("Get(%s) = %v", key, err)
				}
				got[key] = snap.Range
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ranges stored per etcd key (-want +got):\n%s", diff)
			}
			for i, r := range tt.ranges {
				if want := "range " + r.String() + ": "; !strings.Contains(out.String(), want) {
					t.Errorf("output lacks range #%d %q:\n%s", i, want, out.String())
				}
			}
		})
	}
}

func TestRunRejectsRangesKubeAPIServerRejects(t *testing.T) {
	tests := []struct {
		name   string
		ranges []string
		want   string
	}{
		{"two IPv4", []string{"10.96.0.0/24", "10.97.0.0/24"}, "same IP family"},
		{"two IPv6", []string{"fd00:1::/112", "fd00:2::/112"}, "same IP family"},
		{"three", []string{"10.96.0.0/24", "fd00:1::/112", "10.97.0.0/24"}, "3 Service ranges"},
		{"host bits", []string{"10.96.0.1/24"}, "host bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ranges []netip.Prefix
			for _, r := range tt.ranges {
				ranges = append(ranges, netip.MustParsePrefix(r))
			}
			// The etcd given is unreachable: a rejected range must fail before it is used.
			err := Run(context.Background(), Options{Ranges: ranges, EtcdEndpoints: []string{"http://127.0.0.1:1"}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run(%v) = %v, want an error containing %q", tt.ranges, err, tt.want)
			}
		})
	}
}
