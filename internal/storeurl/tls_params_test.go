package storeurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// wantVerifyFailure fails t unless err is a failed certificate
// verification against an unknown CA.
func wantVerifyFailure(t *testing.T, what string, err error) {
	t.Helper()
	var caErr x509.UnknownAuthorityError
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &caErr) || !errors.As(err, &verr) {
		t.Fatalf("%s = %v; want a certificate verification error (unknown authority)", what, err)
	}
}

// firstOp opens raw and runs one operation on the store; it returns the
// first error, from Open or the operation (a lone node is dialled at
// first use).
func firstOp(t *testing.T, raw string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, c, err := Open(ctx, raw, Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = s.Get(ctx, "k", time.Now())
	if errors.Is(err, idempotency.ErrNotFound) {
		return nil
	}
	return err
}

// TestRedisTLSCAFile: a TLS Redis server whose certificate comes from a
// private CA is reached with tls_ca_file= naming that CA, and refused for
// an unknown authority without it. skip_verify=true reaches it too.
func TestRedisTLSCAFile(t *testing.T) {
	bin := testenv.Binary(t, "redis-server")
	ca := testenv.NewCA(t, "storeurl test CA")
	n := startTLSNode(t, bin, "127.0.0.1", ca, false)
	base := "rediss://" + n.addr() + "/0?max_retries=-1&dial_timeout=2s&prefix=" + unique(t) + ":"

	t.Run("with tls_ca_file", func(t *testing.T) {
		s := open(t, base+"&tls_ca_file="+url.QueryEscape(n.caFile), Options{})
		roundTrip(t, s, "k")
	})
	t.Run("without", func(t *testing.T) {
		wantVerifyFailure(t, "a store on a server of a private CA, without tls_ca_file", firstOp(t, base))
	})
	t.Run("another CA's file", func(t *testing.T) {
		other := writeCAFile(t, testenv.NewCA(t, "storeurl test CA"))
		wantVerifyFailure(t, "a store on a server of a private CA, with another CA's file",
			firstOp(t, base+"&tls_ca_file="+url.QueryEscape(other)))
	})
	t.Run("skip_verify", func(t *testing.T) {
		roundTrip(t, open(t, base+"&skip_verify=true", Options{}), "k")
	})
}

// TestTLSClusterCAFile: the same for a TLS Redis Cluster, whose nodes each
// carry a certificate of their own from a private CA. Before, a
// rediss+cluster URL could name no CA (go-redis refused the unknown
// tls_ca_file), so such a cluster could not be opened, nor with
// skip_verify, which go-redis knows for a lone node only.
func TestTLSClusterCAFile(t *testing.T) {
	ca := testenv.NewCA(t, "storeurl test CA")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := startTLSCluster(ctx, t, ca)
	base := "rediss+cluster://" + nodes[0].addr() + "?max_retries=-1&dial_timeout=2s&prefix=" + unique(t) + ":"

	t.Run("with tls_ca_file", func(t *testing.T) {
		s, c, err := Open(ctx, base+"&tls_ca_file="+url.QueryEscape(nodes[0].caFile), Options{})
		if err != nil {
			t.Fatalf("open the TLS cluster with its CA: %v", err)
		}
		defer c.Close()
		client, ok := c.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("closer is a %T, want a *redis.ClusterClient", c)
		}
		// Every master, each verified against its own IP.
		checkTLSCluster(ctx, t, client, s)
	})
	t.Run("without", func(t *testing.T) {
		wantVerifyFailure(t, "a store on a cluster of a private CA, without tls_ca_file", firstOp(t, base))
	})
	t.Run("skip_verify", func(t *testing.T) {
		s, c, err := Open(ctx, base+"&skip_verify=true", Options{})
		if err != nil {
			t.Fatalf("open the TLS cluster with skip_verify=true: %v", err)
		}
		defer c.Close()
		checkTLSCluster(ctx, t, c.(*redis.ClusterClient), s)
	})
}

// writeCAFile writes ca's certificate to a PEM file and returns its path.
func writeCAFile(t *testing.T, ca *testenv.CA) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	ca.WriteCA(t, path)
	return path
}

// TestTLSParamsRefused: both TLS forms refuse the same bad TLS parameters
// with ErrInvalidConfig, saying what is wrong, before connecting; both
// plain forms refuse TLS parameters.
func TestTLSParamsRefused(t *testing.T) {
	dir := t.TempDir()
	good := writeCAFile(t, testenv.NewCA(t, "storeurl test CA"))
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return url.QueryEscape(p)
	}
	empty := file("empty.pem", "")
	keyOnly := file("key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	garbage := file("garbage.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	missing := url.QueryEscape(filepath.Join(dir, "missing.pem"))
	unreadable := url.QueryEscape(dir) // a directory
	for _, tc := range []struct {
		name, query, want string
	}{
		{"missing file", "tls_ca_file=" + missing, "cannot be read: no such file"},
		{"directory", "tls_ca_file=" + unreadable, "cannot be read"},
		{"empty file", "tls_ca_file=" + empty, "holds nothing (it is empty)"},
		{"no certificate", "tls_ca_file=" + keyOnly, "holds no PEM certificate"},
		{"certificate does not parse", "tls_ca_file=" + garbage, "certificate 1 does not parse"},
		{"empty tls_ca_file", "tls_ca_file=", `"tls_ca_file" is empty`},
		{"tls_ca_file twice", "tls_ca_file=" + url.QueryEscape(good) + "&tls_ca_file=" + url.QueryEscape(good), "given 2 times"},
		{"skip_verify not a boolean", "skip_verify=yes", `skip_verify="yes": want true or false`},
		{"both", "skip_verify=true&tls_ca_file=" + url.QueryEscape(good), "contradict"},
	} {
		for _, form := range []string{"rediss://127.0.0.1:1/0", "rediss+cluster://127.0.0.1:1,127.0.0.1:2"} {
			t.Run(tc.name+"/"+strings.Split(form, ":")[0], func(t *testing.T) {
				raw := form + "?max_retries=-1&dial_timeout=100ms&" + tc.query
				err := wantInvalid(t, raw)
				if err != nil && !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Open(%q) = %v; want it to say %q", raw, err, tc.want)
				}
				if err := Check(raw); !errors.Is(err, idempotency.ErrInvalidConfig) {
					t.Errorf("Check(%q) = %v; want ErrInvalidConfig", raw, err)
				}
			})
		}
	}
	for _, raw := range []string{
		"redis://127.0.0.1:1/0?skip_verify=true",
		"redis://127.0.0.1:1/0?tls_ca_file=" + url.QueryEscape(good),
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?skip_verify=false",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?tls_ca_file=" + url.QueryEscape(good),
	} {
		if err := wantInvalid(t, raw); err != nil && !strings.Contains(err.Error(), "is for TLS") {
			t.Errorf("Open(%q) = %v; want it to say the parameter is for TLS", raw, err)
		}
	}
}

// TestTLSParamsSameOnBothForms: the TLS config a rediss URL and a
// rediss+cluster URL get from the same TLS parameters verifies the same
// way (the cluster's per-node name check aside).
func TestTLSParamsSameOnBothForms(t *testing.T) {
	ca := testenv.NewCA(t, "storeurl test CA")
	caFile := url.QueryEscape(writeCAFile(t, ca))
	for _, query := range []string{"", "skip_verify=true", "skip_verify=0", "tls_ca_file=" + caFile} {
		ro, _, err := redisOptions("rediss://127.0.0.1:1/0?" + query)
		if err != nil {
			t.Fatalf("rediss with %q: %v", query, err)
		}
		co, _, err := clusterOptions("rediss+cluster", "//127.0.0.1:1,127.0.0.1:2?"+query)
		if err != nil {
			t.Fatalf("rediss+cluster with %q: %v", query, err)
		}
		a, b := ro.TLSConfig, co.TLSConfig
		if a.InsecureSkipVerify != b.InsecureSkipVerify || a.MinVersion != b.MinVersion || a.MinVersion < tls.VersionTLS12 {
			t.Errorf("%q: rediss skip %v min %x; rediss+cluster skip %v min %x", query,
				a.InsecureSkipVerify, a.MinVersion, b.InsecureSkipVerify, b.MinVersion)
		}
		wantPool := strings.HasPrefix(query, "tls_ca_file")
		for name, pool := range map[string]*x509.CertPool{"rediss": a.RootCAs, "rediss+cluster": b.RootCAs} {
			if (pool != nil) != wantPool || wantPool && !pool.Equal(ca.Pool) {
				t.Errorf("%q: %s trusts %v; want the file's CA: %v", query, name, pool, wantPool)
			}
		}
	}
}

// TestCheck: Check refuses what Open refuses of a URL before connecting,
// and passes a good URL of a store that is not there.
func TestCheck(t *testing.T) {
	bolt := filepath.Join(t.TempDir(), "never-made.db")
	for _, raw := range []string{
		"memory",
		"bolt:" + bolt,
		"redis://127.0.0.1:1/0?prefix=p:&clock=caller&dial_timeout=1s",
		"rediss://127.0.0.1:1/0?skip_verify=true",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?clock=server",
		"postgres://u:p@127.0.0.1:1/x?sslmode=disable&schema=idem&clock=server&application_name=a",
	} {
		if err := Check(raw); err != nil {
			t.Errorf("Check(%q) = %v; want nil", raw, err)
		}
	}
	if _, err := os.Stat(bolt); !os.IsNotExist(err) {
		t.Errorf("Check made a bolt file: %v", err)
	}
	for _, tc := range []struct {
		raw  string
		want error
	}{
		{"", ErrUnknownScheme},
		{"mysql://x", ErrUnknownScheme},
		{"memory:extra", idempotency.ErrInvalidConfig},
		{"bolt:", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?clock=moon", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?clock=", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?clock=server&clock=caller", idempotency.ErrInvalidConfig},
		{"redis://127.0.0.1:1/0?bogus_option=1", idempotency.ErrInvalidConfig},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2?clock=moon", idempotency.ErrInvalidConfig},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2/3", idempotency.ErrInvalidConfig},
		{"postgres://127.0.0.1:1/x?clock=moon", idempotency.ErrInvalidConfig},
		{"postgres://127.0.0.1:1/x?tabel=t", idempotency.ErrInvalidConfig},
		{"postgres://127.0.0.1:1/x?sslmode=sometimes", idempotency.ErrInvalidConfig},
	} {
		if err := Check(tc.raw); !errors.Is(err, tc.want) {
			t.Errorf("Check(%q) = %v; want %v", tc.raw, err, tc.want)
		}
	}
}
