package redisstore

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency/internal/testenv"
)

// privateServer is a redis-server of the test's own, on a free port in a
// t.TempDir, stopped at cleanup. Fault tests pause and kill it; the shared
// server is never touched.
type privateServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
}

func startPrivateServer(t testing.TB, extra ...string) *privateServer {
	t.Helper()
	ps := &privateServer{t: t, bin: testenv.Binary(t, "redis-server"), dir: t.TempDir(), port: freePort(t), args: extra}
	ps.start()
	t.Cleanup(ps.stop)
	return ps
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (ps *privateServer) addr() string { return "127.0.0.1:" + strconv.Itoa(ps.port) }

func (ps *privateServer) start() {
	ps.t.Helper()
	args := append([]string{"--port", strconv.Itoa(ps.port), "--bind", "127.0.0.1", "--dir", ps.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no", "--maxmemory-policy", "noeviction"}, ps.args...)
	cmd := exec.Command(ps.bin, args...)
	log, err := os.OpenFile(filepath.Join(ps.dir, "redis.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		ps.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		ps.t.Fatal(err)
	}
	log.Close()
	ps.cmd = cmd
	// Wait (bounded) until it answers PING.
	c := redis.NewClient(&redis.Options{Addr: ps.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(ps.dir, "redis.log"))
			ps.t.Fatalf("private redis-server on %s did not start: %v\n%s", ps.addr(), err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (ps *privateServer) signal(sig syscall.Signal) {
	ps.t.Helper()
	if err := ps.cmd.Process.Signal(sig); err != nil {
		ps.t.Fatalf("signal %v: %v", sig, err)
	}
}

// kill sends SIGKILL and reaps the process.
func (ps *privateServer) kill() {
	ps.t.Helper()
	if ps.cmd == nil {
		return
	}
	_ = ps.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies on SIGKILL anyway; keep it simple
	_ = ps.cmd.Process.Kill()
	_ = ps.cmd.Wait()
	ps.cmd = nil
}

func (ps *privateServer) stop() { ps.kill() }

// client returns a client of the private server that honours context
// deadlines and fails fast.
func (ps *privateServer) client(t testing.TB) *redis.Client {
	return newClient(t, &redis.Options{Addr: ps.addr()})
}

func newClient(t testing.TB, o *redis.Options) *redis.Client {
	o.ContextTimeoutEnabled = true
	if o.DialTimeout == 0 {
		o.DialTimeout = time.Second
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// randomPrefix returns a prefix no other store uses.
func randomPrefix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// sharedClient returns a client of the shared test server.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return newClient(t, o)
}

// cleanPrefix deletes the keys under prefix at cleanup (bounded SCAN).
func cleanPrefix(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		del := func(ctx context.Context, c redis.UniversalClient) error {
			it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for it.Next(ctx) {
				c.Del(ctx, it.Val())
			}
			return it.Err()
		}
		if cc, ok := c.(*redis.ClusterClient); ok {
			_ = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
			return
		}
		_ = del(ctx, c)
	})
}

// commandCalls returns the calls counted by INFO commandstats, by command
// name (lower case).
func commandCalls(t testing.TB, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("commandstats line %q: %v", line, err)
				}
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}

// delta returns after-before for the commands that changed, ignoring the
// INFO calls themselves.
func delta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range after {
		if k == "info" {
			continue
		}
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// privateCluster is a Redis Cluster of two private masters without
// replicas: the first holds slots 0-8191, the second 8192-16383. A node
// that misses the other for 500 ms marks it failing.
type privateCluster struct {
	nodes  []*privateServer
	admin  []*redis.Client // one per node
	ids    []string        // the nodes' IDs
	ranges [][2]int        // the nodes' slots, first and last
}

func startPrivateCluster(t testing.TB) *privateCluster {
	t.Helper()
	return startPrivateClusterOf(t, [][2]int{{0, 8191}, {8192, 16383}})
}

// startPrivateClusterOf is startPrivateCluster with a master for each of
// ranges, which must cover the slots.
func startPrivateClusterOf(t testing.TB, ranges [][2]int) *privateCluster {
	t.Helper()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "500"}
	pc := &privateCluster{ranges: ranges}
	ctx := context.Background()
	for i := range pc.ranges {
		ps := startPrivateServer(t, args...)
		c := ps.client(t)
		id, err := c.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, "cluster", "addslotsrange", pc.ranges[i][0], pc.ranges[i][1]).Err(); err != nil {
			t.Fatal(err)
		}
		pc.nodes, pc.admin, pc.ids = append(pc.nodes, ps), append(pc.admin, c), append(pc.ids, id)
	}
	for _, n := range pc.nodes[1:] {
		if err := pc.admin[0].Do(ctx, "cluster", "meet", "127.0.0.1", n.port).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pc.waitOK(t, pc.admin...)
	return pc
}

// waitOK waits (bounded) until each of cs reports cluster_state:ok.
func (pc *privateCluster) waitOK(t testing.TB, cs ...*redis.Client) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range cs {
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("private cluster not ok:\n%s", info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// addrs returns the nodes' addresses.
func (pc *privateCluster) addrs() []string {
	var a []string
	for _, n := range pc.nodes {
		a = append(a, n.addr())
	}
	return a
}

// node returns the index of the node that holds key's slot.
func (pc *privateCluster) node(t testing.TB, key string) int {
	t.Helper()
	slot, err := pc.admin[0].ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range pc.ranges {
		if int(slot) >= r[0] && int(slot) <= r[1] {
			return i
		}
	}
	t.Fatalf("slot %d of %q is in no node's range", slot, key)
	return -1
}
