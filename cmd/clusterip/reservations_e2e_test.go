package main

import (
	"encoding/json"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestReservationsVerbsOnARealCluster runs "clusterip reservations" against a real stock
// kube-apiserver v1.37.2 as a user would: create one kept for a Service and one anonymous with a
// cooldown, list them as a table (and wide), their names, and an IPAddressList in JSON and YAML, see bad input refused with exit 2 and nothing
// written, and delete one.
func TestReservationsVerbsOnARealCluster(t *testing.T) {
	t.Parallel()
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	waitForDefaultServiceCIDR(t, api.Client)
	kc := []string{"--kubeconfig", writeKubeconfigWithToken(t, api.Config.Host, api.Config.BearerToken)}
	run := func(code int, args ...string) result {
		t.Helper()
		r := clusterip(t, append(append([]string{"reservations"}, args...), kc...)...)
		if r.code != code {
			t.Fatalf("clusterip reservations %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, r.code, code, r.stdout, r.stderr)
		}
		return r
	}
	run(0, "create", "10.96.0.20", "--for", "default/web", "--reason", "clients pin it")
	run(0, "create", "10.96.0.21", "--name", "cooldown-a", "--for-duration", "10m")
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "10.97.0.1", "--name", "x"}, "10.97.0.1"},
		{[]string{"create", "10.96.0.0", "--name", "x"}, "10.96.0.0"},
		{[]string{"create", "10.96.0.20", "--name", "x"}, "10.96.0.20"},
		{[]string{"create", "10.96.0.22"}, "Name"},
		{[]string{"create", "10.96.0.22", "--for", "web"}, "NAMESPACE/NAME"},
		{[]string{"create", "10.96.0.22", "--name", "x", "--for-duration", "1m", "--expires", "2030-01-01T00:00:00Z"}, "give one"},
		{[]string{"delete", "10.96.0.1"}, "10.96.0.1"},
		// One bound on an end (ten years, as Retain/<duration>) and no character that displays
		// otherwise than it reads, whichever way a reservation is made.
		{[]string{"create", "10.96.0.22", "--name", "x", "--expires", "9999-12-31T00:00:00Z"}, "more than ten years from now"},
		{[]string{"create", "10.96.0.22", "--name", "x", "--for-duration", "87601h"}, "more than ten years from now"},
		{[]string{"create", "10.96.0.22", "--name", "x", "--reason", "kept for \u202egnp.exe"}, "U+202E"},
		{[]string{"create", "10.96.0.22", "--name", "x", "--reason", "db\u200bprod"}, "U+200B"},
	} {
		r := run(exitCouldNotRun, bad.args...)
		if !strings.Contains(r.stderr, bad.want) {
			t.Errorf("clusterip reservations %q: stderr %q, want it to name %q", bad.args, r.stderr, bad.want)
		}
	}

	// -o json and -o yaml print the IPAddress objects as kubectl get does: an IPAddressList.
	listed := func(format string, unmarshal func([]byte, any) error) []reservation.Reservation {
		t.Helper()
		var list networkingv1.IPAddressList
		if err := unmarshal([]byte(run(0, "list", "-o", format).stdout), &list); err != nil {
			t.Fatalf("list -o %s: %v", format, err)
		}
		if list.Kind != "IPAddressList" || list.APIVersion != "networking.k8s.io/v1" {
			t.Errorf("list -o %s: kind %q, apiVersion %q; want IPAddressList, networking.k8s.io/v1", format, list.Kind, list.APIVersion)
		}
		var rs []reservation.Reservation
		for i := range list.Items {
			if list.Items[i].Kind != "IPAddress" || list.Items[i].UID == "" {
				t.Errorf("list -o %s: item %d has kind %q and UID %q, want the IPAddress object as stored", format, i, list.Items[i].Kind, list.Items[i].UID)
			}
			r, ok := reservation.FromObject(&list.Items[i])
			if !ok {
				t.Errorf("list -o %s: item %d is no reservation: %+v", format, i, list.Items[i])
			}
			rs = append(rs, r)
		}
		return rs
	}
	for _, format := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"json", json.Unmarshal}, {"yaml", func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }}} {
		rs := listed(format.name, format.unmarshal)
		if len(rs) != 2 || rs[0].Addr.String() != "10.96.0.20" || rs[0].For.String() != "default/web" || rs[0].Reason != "clients pin it" ||
			rs[1].Addr.String() != "10.96.0.21" || rs[1].Name != "cooldown-a" || rs[1].Expires.IsZero() {
			t.Errorf("list -o %s = %+v, want the two reservations made", format.name, rs)
		}
	}
	if table := run(0, "list").stdout; !strings.Contains(table, "ADDRESS") || !strings.Contains(table, "default/web") || !strings.Contains(table, "cooldown-a") || strings.Contains(table, "PARENTREF") {
		t.Errorf("list:\n%s\nwant a table of both, without the wide columns", table)
	}
	if wide := run(0, "list", "-o", "wide").stdout; !strings.Contains(wide, "PARENTREF") || !strings.Contains(wide, "services/default/web") {
		t.Errorf("list -o wide:\n%s\nwant the parentRef column", wide)
	}
	if names, want := run(0, "list", "-o", "name").stdout, "ipaddress.networking.k8s.io/10.96.0.20\nipaddress.networking.k8s.io/10.96.0.21\n"; names != want {
		t.Errorf("list -o name = %q, want %q", names, want)
	}
	// clusterip check names a reservation that ended and is still held.
	run(0, "create", "10.96.0.22", "--name", "old", "--expires", "2020-01-01T00:00:00Z")
	rep := checkJSON(t, exitOK, append([]string{"check", "-o", "json"}, kc...)...)
	if len(rep.Reservations) != 1 || rep.Reservations[0].IP != "10.96.0.22" || rep.Reservations[0].Problem != "expired" {
		t.Errorf("check -o json: reservations %+v, want 10.96.0.22 expired", rep.Reservations)
	}
	run(0, "delete", "10.96.0.22")
	run(0, "delete", "10.96.0.21")
	if rs := listed("json", json.Unmarshal); len(rs) != 1 {
		t.Errorf("after delete, list -o json = %+v; want one", rs)
	}
}
