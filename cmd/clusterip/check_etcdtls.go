package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// etcdTLSProblem says why etcd's TLS refuses check, once a call to etcd has failed: the etcd
// client only reports that etcd did not answer in time, whether the network failed or the TLS
// handshake did. It dials each https endpoint with config (nil: no CA bundle, no client
// certificate) and returns an error naming the first one whose TLS fails and what to give,
// or nil if none does or it cannot tell (a plain http endpoint, a refused connection, a
// server that stays silent).
func etcdTLSProblem(endpoints []string, config *tls.Config, timeout time.Duration) error {
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Scheme != "https" {
			continue
		}
		cfg := &tls.Config{}
		if config != nil {
			cfg = config.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", u.Host, cfg)
		var opErr *net.OpError
		switch {
		case errors.As(err, &opErr) && opErr.Op == "dial":
			continue // not a TLS problem
		case err != nil:
			return fmt.Errorf("etcd at %s: TLS handshake failed: %w; does --etcd-cafile hold the CA that signed etcd's serving certificate?", ep, err)
		}
		// With TLS 1.3 the server judges the client certificate after the client's handshake
		// is done, and says so in an alert that the first read returns. A server that accepted
		// it waits for the client to speak: the read times out.
		wait := time.Second
		if timeout > 0 { // --request-timeout 0 is no timeout
			wait = min(timeout, time.Second)
		}
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
		if err != nil && strings.Contains(err.Error(), "remote error: tls:") {
			return fmt.Errorf("etcd at %s refused the client certificate: %w; give --etcd-certfile and --etcd-keyfile of a certificate signed by a CA of etcd's --trusted-ca-file", ep, err)
		}
	}
	return nil
}
