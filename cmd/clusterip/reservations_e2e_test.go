package main

import (
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestReservationsVerbsOnARealCluster runs "clusterip reservations" against a real stock
// kube-apiserver v1.37.2 as a user would: create one kept for a Service and one anonymous with a
// cooldown, list them as a table, JSON and YAML, see bad input refused with exit 2 and nothing
// written, and delete one.
func TestReservationsVerbsOnARealCluster(t *testing.T) {
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

	type item struct {
		Address, For, Name, Reason string
		Expires                    *string
	}
	var list struct{ Items []item }
	if err := json.Unmarshal([]byte(run(0, "list", "-o", "json").stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 || list.Items[0].Address != "10.96.0.20" || list.Items[0].For != "default/web" || list.Items[0].Reason != "clients pin it" ||
		list.Items[1].Address != "10.96.0.21" || list.Items[1].Name != "cooldown-a" || list.Items[1].Expires == nil {
		t.Errorf("list -o json = %+v, want the two reservations made", list.Items)
	}
	var fromYAML struct{ Items []item }
	if err := yaml.Unmarshal([]byte(run(0, "list", "-o", "yaml").stdout), &fromYAML); err != nil || len(fromYAML.Items) != 2 {
		t.Errorf("list -o yaml = %+v, %v; want the two reservations", fromYAML.Items, err)
	}
	if table := run(0, "list").stdout; !strings.Contains(table, "ADDRESS") || !strings.Contains(table, "default/web") || !strings.Contains(table, "cooldown-a") {
		t.Errorf("list:\n%s\nwant a table of both", table)
	}
	// clusterip check names a reservation that ended and is still held.
	run(0, "create", "10.96.0.22", "--name", "old", "--expires", "2020-01-01T00:00:00Z")
	rep := checkJSON(t, exitOK, append([]string{"check", "-o", "json"}, kc...)...)
	if len(rep.Reservations) != 1 || rep.Reservations[0].IP != "10.96.0.22" || rep.Reservations[0].Problem != "expired" {
		t.Errorf("check -o json: reservations %+v, want 10.96.0.22 expired", rep.Reservations)
	}
	run(0, "delete", "10.96.0.22")
	run(0, "delete", "10.96.0.21")
	if err := json.Unmarshal([]byte(run(0, "list", "-o", "json").stdout), &list); err != nil || len(list.Items) != 1 {
		t.Errorf("after delete, list -o json = %+v, %v; want one", list.Items, err)
	}
}
