package main

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestCheckNeverPrintsTheKubeconfigsSecrets runs check at -v=10, where client-go logs every
// request with its headers, with kubeconfigs holding a bearer token and a client key, a wrong
// token, and a basic-auth user name and password, in the user entry or in the server URL
// (client-go still sends them; kube-apiserver has not accepted them since 1.19), and with
// repair: neither stdout nor stderr holds a
// secret, in clear or in the encodings a kubeconfig or an HTTP header gives it.
func TestCheckNeverPrintsTheKubeconfigsSecrets(t *testing.T) {
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{})
	waitForDefaultServiceCIDR(t, api.Client)
	client := newTestCA(t, "kubeconfig-client-ca").issue(t, "clusterip-check", x509.ExtKeyUsageClientAuth)
	const password = "pa55-w0rd-never-printed"
	wrongToken := "0123456789abcdef-wrong-token"

	tokenAndKey := fmt.Sprintf("user:\n    token: %q\n    client-certificate-data: %s\n    client-key-data: %s",
		api.Config.BearerToken, base64.StdEncoding.EncodeToString(client.cert), base64.StdEncoding.EncodeToString(client.key))
	const bearer = `"Authorization: Bearer <masked>"`
	tests := []struct {
		name     string
		user     string   // the kubeconfig's user entry
		urlUser  string   // user:password written into the server URL, if any
		args     []string // the verb, then its flags after --kubeconfig F -v=10
		wantCode int
		masked   string // the Authorization header as client-go logs it
		secrets  []string
	}{
		{"token and client key", tokenAndKey, "", []string{"check"}, exitOK, bearer, slices.Concat(tokenForms(api.Config.BearerToken), keyForms(client.key))},
		{"token and client key, repairing", tokenAndKey, "", []string{"repair", "--leak-grace", "0", "--etcd-servers", e.Endpoints()[0]}, exitOK, bearer,
			slices.Concat(tokenForms(api.Config.BearerToken), keyForms(client.key))},
		{"a wrong token", fmt.Sprintf("user:\n    token: %q", wrongToken), "", []string{"check"}, exitCouldNotRun, bearer, tokenForms(wrongToken)},
		{"basic auth", fmt.Sprintf("user:\n    username: clusterip\n    password: %q", password), "", []string{"check"}, exitCouldNotRun, `"Authorization: Basic <masked>"`,
			[]string{password, base64.StdEncoding.EncodeToString([]byte("clusterip:" + password))}},
		{"a password in the server URL", "user: {}", "clusterip:" + password, []string{"check"}, exitCouldNotRun, `"Authorization: Basic <masked>"`,
			[]string{password, base64.StdEncoding.EncodeToString([]byte("clusterip:" + password))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := api.Config.Host
			if tt.urlUser != "" {
				server = strings.Replace(server, "https://", "https://"+tt.urlUser+"@", 1)
			}
			kubeconfig := writeKubeconfigUser(t, server, tt.user)
			r := clusterip(t, slices.Concat(tt.args[:1], []string{"--kubeconfig", kubeconfig, "-v=10"}, tt.args[1:])...)
			if r.code != tt.wantCode {
				t.Fatalf("check: exit %d, want %d\nstderr (end):\n%s", r.code, tt.wantCode, tail(r.stderr, 2000))
			}
			// The witness that the credentials went out with requests that -v=10 logged.
			if !strings.Contains(r.stderr, tt.masked) {
				t.Fatalf("check -v=10 logged no request with the header %q; the test would prove nothing:\n%s", tt.masked, tail(r.stderr, 2000))
			}
			for _, s := range tt.secrets {
				for stream, out := range map[string]string{"stdout": r.stdout, "stderr": r.stderr} {
					if i := strings.Index(out, s); i >= 0 {
						t.Errorf("check -v=10 printed the secret %q on %s: ...%s...", s, stream, out[max(i-200, 0):min(i+len(s)+50, len(out))])
					}
				}
			}
		})
	}
}

// tokenForms returns a bearer token as a kubeconfig holds it and as it could be printed.
func tokenForms(token string) []string {
	return []string{token, base64.StdEncoding.EncodeToString([]byte(token))}
}

// keyForms returns pieces of a PEM private key that any printing of it would contain: the first
// line of its base64 body, and the start of the base64 of the whole PEM (as client-key-data).
func keyForms(keyPEM []byte) []string {
	lines := strings.Split(string(keyPEM), "\n")
	return []string{lines[1], base64.StdEncoding.EncodeToString(keyPEM)[:40]}
}

// writeKubeconfigUser writes a kubeconfig whose one context reaches server (its certificate not
// verified) as the user whose YAML entry is user.
func writeKubeconfigUser(t *testing.T, server, user string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  %s
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`, server, user)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
