package storeurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"
)

// dialNodesByName makes a TLS cluster client check each node's certificate
// against that node's own address.
//
// go-redis's ParseClusterURL sets TLSConfig.ServerName to the first seed's
// host, and every node client dials with that config as is, so each node
// is held to the seed's name: a cluster whose nodes carry certificates of
// their own fails on every node but the seed, and one reached by IP on
// every node whose IP is not the seed's. The dialer installed here accepts
// a node's certificate when it names either the node's own host (a name or
// an IP, as the cluster announces it) or the seed's host. The second keeps
// what go-redis allowed: clusters that announce IPs but present one
// certificate naming the seed's host name. SNI is the node's host name, or
// the seed's when the node is announced by IP.
func dialNodesByName(co *redis.ClusterOptions) {
	base := co.TLSConfig
	if base == nil || base.InsecureSkipVerify {
		return
	}
	seed := base.ServerName
	co.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("storeurl: cluster node address %q: %w", addr, err)
		}
		// go-redis's own dialer, for its timeout and keep-alive, with the
		// node's TLS config. co.DialTimeout is read here, after
		// NewClusterClient has filled in its default.
		dial := redis.NewDialer(&redis.Options{DialTimeout: co.DialTimeout, TLSConfig: nodeTLS(base, seed, host)})
		return dial(ctx, network, addr)
	}
}

// nodeTLS returns base for a node whose host is host: the certificate
// chain is verified as crypto/tls would, and the names it may carry are
// host's and seed's.
func nodeTLS(base *tls.Config, seed, host string) *tls.Config {
	c := base.Clone()
	c.ServerName = host
	if net.ParseIP(host) != nil {
		c.ServerName = seed // SNI; crypto/tls sends none for an IP
	}
	names := []string{host}
	if seed != "" && seed != host {
		names = append(names, seed)
	}
	// Verified in VerifyConnection: crypto/tls checks one name only.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyNames(base, cs, names)
	}
	return c
}

// verifyNames does crypto/tls's client verification of cs's chain under
// base, accepting a leaf certificate valid for any of names.
func verifyNames(base *tls.Config, cs tls.ConnectionState, names []string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("storeurl: the cluster node sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: base.RootCAs, Intermediates: x509.NewCertPool()}
	if base.Time != nil {
		opts.CurrentTime = base.Time()
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	for _, n := range names {
		if leaf.VerifyHostname(n) == nil {
			return nil
		}
	}
	err := leaf.VerifyHostname(names[0])
	if len(names) > 1 {
		err = fmt.Errorf("%w, nor %s (the first seed's host)", err, names[1])
	}
	return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
}
