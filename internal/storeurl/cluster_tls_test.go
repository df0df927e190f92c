package storeurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// tlsOptions is what Open makes of a rediss+cluster URL whose first seed is
// seed, trusting ca (Open trusts the system's roots; a test's CA is not
// one of them).
func tlsOptions(t *testing.T, seed string, ca *testenv.CA) (*redis.ClusterOptions, map[string]string) {
	t.Helper()
	co, p, err := clusterOptions("rediss+cluster", "//"+seed+"?prefix="+unique(t)+":")
	if err != nil {
		t.Fatal(err)
	}
	co.TLSConfig.RootCAs = ca.Pool
	return co, p
}

// TestClusterNodeCertificateNames: a node of a TLS cluster is held to its
// own host, name or IP, or to the first seed's host (a cluster announcing
// IPs behind one certificate); no other name, and no other CA, passes.
// Before, every node was held to the seed's host alone.
func TestClusterNodeCertificateNames(t *testing.T) {
	ca := testenv.NewCA(t, "storeurl test CA")
	for _, tc := range []struct {
		name     string
		certFor  []string
		other    bool   // issued by another CA
		seed     string // the URL's first host
		dial     string // the node's host, as the cluster announces it
		wantSNI  string
		wantName bool // refused for its names (x509.HostnameError)
		wantCA   bool // refused for its CA (x509.UnknownAuthorityError)
	}{
		{name: "own host name", certFor: []string{"localhost"}, seed: "seed.invalid", dial: "localhost", wantSNI: "localhost"},
		{name: "own IP", certFor: []string{"127.0.0.1"}, seed: "seed.invalid", dial: "127.0.0.1", wantSNI: "seed.invalid"},
		{name: "own IP, seed by IP", certFor: []string{"127.0.0.1"}, seed: "127.0.0.9", dial: "127.0.0.1", wantSNI: ""},
		{name: "seed's name", certFor: []string{"seed.invalid"}, seed: "seed.invalid", dial: "127.0.0.1", wantSNI: "seed.invalid"},
		{name: "another name", certFor: []string{"other.invalid"}, seed: "seed.invalid", dial: "127.0.0.1", wantName: true},
		{name: "another host name", certFor: []string{"other.invalid"}, seed: "seed.invalid", dial: "localhost", wantName: true},
		{name: "another CA", certFor: []string{"127.0.0.1"}, other: true, seed: "seed.invalid", dial: "127.0.0.1", wantCA: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issuer := ca
			if tc.other {
				issuer = testenv.NewCA(t, "storeurl test CA")
			}
			sni := make(chan string, 1)
			l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
				Certificates: []tls.Certificate{issuer.Issue(t, tc.certFor[0], tc.certFor...)},
				GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
					sni <- h.ServerName
					return nil, nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
			_, port, _ := net.SplitHostPort(l.Addr().String())

			co, _ := tlsOptions(t, net.JoinHostPort(tc.seed, "6379"), ca)
			co.DialTimeout = 10 * time.Second
			dial := co.Dialer
			if dial == nil {
				// What a node client dials with when none is set.
				dial = redis.NewDialer(&redis.Options{DialTimeout: co.DialTimeout, TLSConfig: co.TLSConfig})
			}
			conn, err := dial(context.Background(), "tcp", net.JoinHostPort(tc.dial, port))
			if err == nil {
				conn.Close()
			}
			var hostErr x509.HostnameError
			var caErr x509.UnknownAuthorityError
			switch {
			case tc.wantName:
				if !errors.As(err, &hostErr) {
					t.Fatalf("dial %s with a certificate for %q = %v; want x509.HostnameError", tc.dial, tc.certFor, err)
				}
			case tc.wantCA:
				if !errors.As(err, &caErr) {
					t.Fatalf("dial %s with a certificate of another CA = %v; want x509.UnknownAuthorityError", tc.dial, err)
				}
			case err != nil:
				t.Fatalf("dial %s (seed %s) with a certificate for %q: %v", tc.dial, tc.seed, tc.certFor, err)
			default:
				if got := <-sni; got != tc.wantSNI {
					t.Errorf("SNI = %q; want %q", got, tc.wantSNI)
				}
			}
		})
	}
}

// tlsNode is a redis-server of the test's own with TLS on every port, a
// Cluster node announcing ip.
type tlsNode struct {
	ip         string
	port, bus  int
	dir        string
	caFile     string // the CA's certificate, PEM
	cmd        *exec.Cmd
	cli        *redis.Client // a plain client of this node alone
	clientConf *tls.Config
}

func (n *tlsNode) addr() string { return net.JoinHostPort(n.ip, strconv.Itoa(n.port)) }

func freePortOn(t *testing.T, ip string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startTLSNode starts a TLS redis-server on ip, with a certificate from ca
// naming ip alone: a Cluster node with cluster, a lone server without.
func startTLSNode(t *testing.T, bin, ip string, ca *testenv.CA, cluster bool) *tlsNode {
	t.Helper()
	n := &tlsNode{ip: ip, port: freePortOn(t, ip), bus: freePortOn(t, ip), dir: t.TempDir()}
	certFile, keyFile := testenv.WritePEM(t, n.dir, ca.Issue(t, ip, ip))
	n.caFile = filepath.Join(n.dir, "ca.pem")
	ca.WriteCA(t, n.caFile)
	args := []string{"--port", "0", "--tls-port", strconv.Itoa(n.port), "--bind", ip, "--dir", n.dir,
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", n.caFile,
		"--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
		"--maxmemory-policy", "noeviction"}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(n.bus), "--cluster-announce-ip", ip,
			"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"), "--tls-cluster", "yes")
	}
	n.cmd = exec.Command(bin, args...)
	log, err := os.Create(filepath.Join(n.dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd.Stdout, n.cmd.Stderr = log, log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	t.Cleanup(func() {
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
	})
	n.clientConf = &tls.Config{RootCAs: ca.Pool, ServerName: ip}
	n.cli = redis.NewClient(&redis.Options{Addr: n.addr(), TLSConfig: n.clientConf, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { n.cli.Close() })
	n.waitFor(t, "PING", func() error { return n.cli.Ping(context.Background()).Err() })
	return n
}

// waitFor polls check until it succeeds, failing t after 30s.
func (n *tlsNode) waitFor(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(n.dir, "redis.log"))
			t.Fatalf("TLS node %s: %s: %v\n%s", n.addr(), what, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTLSClusterPerNodeCertificates: a private TLS Redis Cluster of three
// masters on 127.0.0.1, .2 and .3, each with a certificate naming its own
// IP alone, reached through the first: every master is dialled and
// verified, and the store works across them. Before, every node but the
// seed failed verification against the seed's IP.
func TestTLSClusterPerNodeCertificates(t *testing.T) {
	ca := testenv.NewCA(t, "storeurl test CA")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := startTLSCluster(ctx, t, ca)

	co, p := tlsOptions(t, nodes[0].addr(), ca) // the first node only
	client := redis.NewClusterClient(co)
	s, closer, err := newRedis(ctx, client, p, Options{})
	if err != nil {
		t.Fatalf("open the TLS cluster through %s: %v", nodes[0].addr(), err)
	}
	defer closer.Close()
	checkTLSCluster(ctx, t, client, s)
}

// startTLSCluster starts a private TLS Redis Cluster of three masters on
// 127.0.0.1, .2 and .3, each with a certificate from ca naming its own IP
// alone, and waits until it is whole.
func startTLSCluster(ctx context.Context, t *testing.T, ca *testenv.CA) []*tlsNode {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	var nodes []*tlsNode
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, startTLSNode(t, bin, fmt.Sprintf("127.0.0.%d", i), ca, true))
	}
	slots := [][2]int64{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, n := range nodes {
		if err := n.cli.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", slots[i][0], slots[i][1]).Err(); err != nil {
			t.Fatalf("ADDSLOTSRANGE on %s: %v", n.addr(), err)
		}
		if i > 0 {
			if err := nodes[0].cli.Do(ctx, "CLUSTER", "MEET", n.ip, n.port, n.bus).Err(); err != nil {
				t.Fatalf("MEET %s: %v", n.addr(), err)
			}
		}
	}
	for _, n := range nodes {
		n.waitFor(t, "cluster state ok", func() error {
			info, err := n.cli.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
				return errors.New(strings.ReplaceAll(info, "\r\n", " "))
			}
			return nil
		})
	}
	return nodes
}

// checkTLSCluster checks that client, of a cluster from startTLSCluster,
// knows its three hosts and reaches every master, and that s, a store on
// it, works on keys of every master.
func checkTLSCluster(ctx context.Context, t *testing.T, client *redis.ClusterClient, s idempotency.Store) {
	t.Helper()
	hosts := map[string]bool{}
	ss, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		for _, n := range s.Nodes {
			h, _, _ := net.SplitHostPort(n.Addr)
			hosts[h] = true
		}
	}
	if len(hosts) != 3 {
		t.Fatalf("the cluster announces hosts %v; want three", hosts)
	}
	var masters atomic.Int32
	if err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		masters.Add(1)
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("PING every master: %v", err)
	}
	if masters.Load() != 3 {
		t.Fatalf("pinged %d masters; want 3", masters.Load())
	}
	for i := range 10 {
		roundTrip(t, s, "k"+strconv.Itoa(i))
	}
}
