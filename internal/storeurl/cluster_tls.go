package storeurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The TLS query parameters of rediss://, rediss+cluster:// and
// rediss+sentinel:// URLs. Open takes them itself for each form, so that
// they mean the same in each: go-redis's ParseURL and ParseFailoverURL know
// skip_verify but its ParseClusterURL does not, and none can name a CA.
const (
	paramSkipVerify = "skip_verify"
	paramCAFile     = "tls_ca_file"
)

// applyTLSParams applies the TLS parameters in p to c, the TLS config that
// go-redis made of a URL with the given scheme (nil for redis://, which
// takes no TLS parameter).
func applyTLSParams(c *tls.Config, scheme string, p map[string]string) error {
	skip, hasSkip := p[paramSkipVerify]
	caFile, hasCA := p[paramCAFile]
	if c == nil {
		for _, n := range []string{paramSkipVerify, paramCAFile} {
			if _, ok := p[n]; ok {
				return invalid("query parameter %q is for TLS, which %s:// does not use (rediss://, rediss+cluster:// and rediss+sentinel:// do)", n, scheme)
			}
		}
		return nil
	}
	// ParseURL asks for TLS 1.2 at least; ParseClusterURL leaves it to
	// crypto/tls's default.
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	if hasSkip {
		// go-redis's words for a boolean.
		switch skip {
		case "true", "1":
			c.InsecureSkipVerify = true
		case "false", "0":
		default:
			return invalid("%s=%q: want true or false", paramSkipVerify, skip)
		}
	}
	if !hasCA {
		return nil
	}
	if c.InsecureSkipVerify {
		return invalid("%s and %s=%s contradict each other: with verification skipped no CA is consulted; leave one out", paramCAFile, paramSkipVerify, skip)
	}
	pool, err := loadCAFile(caFile)
	if err != nil {
		return err
	}
	c.RootCAs = pool
	return nil
}

// loadCAFile reads a PEM bundle of CA certificates. A file that cannot be
// read, holds no certificate or a certificate that does not parse is a
// configuration error: trusting what is left, or the system's roots in
// its place, would not be what the URL asked for.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is quoted below
		}
		return nil, invalid("%s=%q cannot be read: %v", paramCAFile, path, err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue // a bundle may carry other blocks; they are not CAs
		}
		n++
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, invalid("%s=%q: certificate %d does not parse: %v", paramCAFile, path, n, err)
		}
		pool.AddCert(cert)
	}
	if n == 0 {
		what := "no PEM certificate"
		if strings.TrimSpace(string(data)) == "" {
			what = "nothing (it is empty)"
		}
		return nil, invalid("%s=%q holds %s; want a PEM bundle of CA certificates (-----BEGIN CERTIFICATE-----)", paramCAFile, path, what)
	}
	return pool, nil
}

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
	// co.DialTimeout is read at each dial, after NewClusterClient has
	// filled in its default.
	if d := nodeDialer(co.TLSConfig, func() time.Duration { return co.DialTimeout }); d != nil {
		co.Dialer = d
	}
}

// nodeDialer returns a dialer that checks each node's certificate as
// dialNodesByName describes, base being the TLS config go-redis made of
// the URL (its ServerName the URL's first host), or nil when there is no
// certificate to check.
func nodeDialer(base *tls.Config, dialTimeout func() time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if base == nil || base.InsecureSkipVerify {
		return nil
	}
	seed := base.ServerName
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("storeurl: node address %q: %w", addr, err)
		}
		// go-redis's own dialer, for its timeout and keep-alive, with the
		// node's TLS config.
		dial := redis.NewDialer(&redis.Options{DialTimeout: dialTimeout(), TLSConfig: nodeTLS(base, seed, host)})
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
		return errors.New("storeurl: the node sent no certificate")
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
		err = fmt.Errorf("%w, nor %s (the URL's first host)", err, names[1])
	}
	return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
}
