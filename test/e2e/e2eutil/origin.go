package e2eutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Origin is the site the pool e2e's crawlers fetch: HTTP on port 80 and
// HTTPS on 443 of one address of the hypervisor's namespace (the guests'
// gateway, a destination the Proxies' Access admits), the HTTPS one with a
// certificate of a CA the test makes itself. It answers 200 with a small
// page and records every request's source address: a request from an
// address that is not the egress of a published replica did not go through
// the pool (sent directly, or by something else).
type Origin struct {
	// IP is the address it serves on.
	IP string
	// RootCAs trusts the HTTPS server's certificate.
	RootCAs *x509.CertPool

	// URLs are the HTTP and the HTTPS root.
	HTTPURL, HTTPSURL string

	mu      sync.Mutex
	egress  map[string]bool
	hits    []Hit
	servers []*http.Server
}

// Hit is one request that reached the origin.
type Hit struct {
	Source, Path string
	TLS          bool
	At           time.Time
}

// StartOrigin serves on ip:80 and ip:443 until Close.
func StartOrigin(ip string) (*Origin, error) { return startOrigin(ip, "80", "443") }

// startOrigin serves HTTP on ip:plainPort and HTTPS on ip:tlsPort ("0"
// picks one: the unit tests).
func startOrigin(ip, plainPort, tlsPort string) (*Origin, error) {
	cert, pool, err := selfSignedChain(ip)
	if err != nil {
		return nil, err
	}
	o := &Origin{IP: ip, RootCAs: pool, egress: map[string]bool{}}
	plain, err := net.Listen("tcp", net.JoinHostPort(ip, plainPort))
	if err != nil {
		return nil, fmt.Errorf("origin: %w", err)
	}
	secure, err := net.Listen("tcp", net.JoinHostPort(ip, tlsPort))
	if err != nil {
		_ = plain.Close()
		return nil, fmt.Errorf("origin: %w", err)
	}
	o.HTTPURL, o.HTTPSURL = "http://"+plain.Addr().String(), "https://"+secure.Addr().String()
	for _, l := range []net.Listener{plain, tls.NewListener(secure, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})} {
		srv := &http.Server{Handler: o, ReadHeaderTimeout: 10 * time.Second}
		o.servers = append(o.servers, srv)
		go func() { _ = srv.Serve(l) }()
	}
	return o, nil
}

// selfSignedChain makes a CA and a server certificate for ip signed by it.
func selfSignedChain(ip string) (tls.Certificate, *x509.CertPool, error) {
	addr := net.ParseIP(ip)
	if addr == nil {
		return tls.Certificate{}, nil, fmt.Errorf("origin address %q is not an IP address", ip)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pool e2e origin CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ip}, IPAddresses: []net.IP{addr},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool, nil
}

func (o *Origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	o.mu.Lock()
	o.hits = append(o.hits, Hit{Source: source, Path: r.URL.Path, TLS: r.TLS != nil, At: time.Now()})
	o.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintln(w, "<!doctype html><title>ok</title>")
}

// Allow adds addresses to the egress set: the published replicas'.
func (o *Origin) Allow(addrs ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range addrs {
		o.egress[a] = true
	}
}

// OriginCounts is what reached the origin under one path prefix.
type OriginCounts struct {
	Requests, HTTPS int
	// Direct counts requests from an address outside the egress set;
	// DirectSources names those addresses.
	Direct        int
	DirectSources []string
}

// Counts returns what reached the origin under prefix.
func (o *Origin) Counts(prefix string) OriginCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	var c OriginCounts
	direct := map[string]bool{}
	for _, h := range o.hits {
		if !strings.HasPrefix(h.Path, prefix) {
			continue
		}
		c.Requests++
		if h.TLS {
			c.HTTPS++
		}
		// The set only grows, so checking at the end sees an address the
		// list named at any time.
		if !o.egress[h.Source] {
			c.Direct++
			direct[h.Source] = true
		}
	}
	for s := range direct {
		c.DirectSources = append(c.DirectSources, s)
	}
	sort.Strings(c.DirectSources)
	return c
}

// From returns the requests from source that arrived in (after, before].
func (o *Origin) From(source string, after, before time.Time) []Hit {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Hit
	for _, h := range o.hits {
		if h.Source == source && h.At.After(after) && !h.At.After(before) {
			out = append(out, h)
		}
	}
	return out
}

// Close stops serving.
func (o *Origin) Close() error {
	var errs []error
	for _, s := range o.servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
