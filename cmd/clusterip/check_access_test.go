package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip/featuregate"
)

func TestNeededPermissionsFollowModeRepairAndEtcd(t *testing.T) {
	read := []string{"list services", "get services"}
	objects := []string{"list servicecidrs.networking.k8s.io", "list ipaddresses.networking.k8s.io", "get ipaddresses.networking.k8s.io", "list namespaces"}
	cidr := []string{"get servicecidrs.networking.k8s.io"}
	writes := []string{"create ipaddresses.networking.k8s.io", "update ipaddresses.networking.k8s.io", "delete ipaddresses.networking.k8s.io"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name     string
		mode     featuregate.Mode
		repair   bool
		withEtcd bool
		want     []string
	}{
		{"Legacy reads Services only", featuregate.Legacy, false, true, read},
		{"Legacy repairs in etcd only", featuregate.Legacy, true, true, read},
		{"DualWrite with etcd", featuregate.DualWrite, false, true, cat(read, objects)},
		{"without etcd the ServiceCIDR kubernetes is read", featuregate.IPAddressOnly, false, false, cat(read, objects, cidr)},
		{"repair writes IPAddress objects", featuregate.DualWrite, true, true, cat(read, objects, writes)},
		{"repair without etcd", featuregate.IPAddressOnly, true, false, cat(read, objects, cidr, writes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, p := range neededPermissions(tt.mode, tt.repair, tt.withEtcd) {
				got = append(got, p.verb+" "+p.resourceName())
				wantRole := checkRole
				if p.verb == "create" || p.verb == "update" || p.verb == "delete" {
					wantRole = checkRepairRole
				}
				if p.role != wantRole {
					t.Errorf("%s %s is granted by %s, want %s", p.verb, p.resourceName(), p.role, wantRole)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("neededPermissions(%v, repair %v, etcd %v) (-want +got):\n%s", tt.mode, tt.repair, tt.withEtcd, diff)
			}
		})
	}
}

func TestMissingPermissionsAreNamedByResourceWithTheirRoles(t *testing.T) {
	all := neededPermissions(featuregate.IPAddressOnly, true, false)
	tests := []struct {
		name             string
		missing          []permission
		wantWhat, wantBy string
	}{
		{"repair verbs", all[len(all)-3:], "create, update, delete ipaddresses.networking.k8s.io", "ClusterRole clusterip-check-repair"},
		{"everything", all,
			"list, get services and list, get servicecidrs.networking.k8s.io and list, get, create, update, delete ipaddresses.networking.k8s.io and list namespaces",
			"ClusterRoles clusterip-check and clusterip-check-repair"},
		{"one verb", all[:1], "list services", "ClusterRole clusterip-check"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describeMissing(tt.missing); got != tt.wantWhat {
				t.Errorf("describeMissing() = %q, want %q", got, tt.wantWhat)
			}
			if got := rolesOf(tt.missing); got != tt.wantBy {
				t.Errorf("rolesOf() = %q, want %q", got, tt.wantBy)
			}
		})
	}
}

func TestCredentialsInTheServerURLMoveToBasicAuth(t *testing.T) {
	tests := []struct {
		name string
		in   rest.Config
		want rest.Config
	}{
		{"none", rest.Config{Host: "https://10.0.0.1:6443"}, rest.Config{Host: "https://10.0.0.1:6443"}},
		{"user and password", rest.Config{Host: "https://u:p%40ss@10.0.0.1:6443/prefix"},
			rest.Config{Host: "https://10.0.0.1:6443/prefix", Username: "u", Password: "p@ss"}},
		{"the config's own win", rest.Config{Host: "https://u:p@10.0.0.1", Username: "v", Password: "q"},
			rest.Config{Host: "https://10.0.0.1", Username: "v", Password: "q"}},
		{"a bad URL is left to client-go", rest.Config{Host: "https://u:p@[::1"}, rest.Config{Host: "https://u:p@[::1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in
			moveURLCredentials(&got)
			if got.Host != tt.want.Host || got.Username != tt.want.Username || got.Password != tt.want.Password {
				t.Errorf("moveURLCredentials(%q) = host %q, user %q, password %q; want %q, %q, %q",
					tt.in.Host, got.Host, got.Username, got.Password, tt.want.Host, tt.want.Username, tt.want.Password)
			}
		})
	}
}
