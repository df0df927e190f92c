package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
	"github.com/archlab/idempotency/internal/testenv"
)

// sentinelMaster is the name the private sentinels monitor the master by.
const sentinelMaster = "m"

// privateSentinel is a master, one replica of it and three sentinels
// monitoring it (quorum 2), all private: free ports, t.TempDir, killed at
// cleanup. The sentinels judge a master down after 500 ms without an
// answer.
type privateSentinel struct {
	master, replica *privateServer
	sentinels       []*sentinelProc
}

// sentinelProc is a redis-server in sentinel mode.
type sentinelProc struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (sp *sentinelProc) addr() string { return "127.0.0.1:" + strconv.Itoa(sp.port) }

func startPrivateSentinel(t *testing.T) *privateSentinel {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	m := startPrivateServer(t)
	r := startPrivateServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(m.port))
	ps := &privateSentinel{master: m, replica: r}
	ctx := context.Background()
	cr := r.client(t)
	waitForUpTo(t, 20*time.Second, "the replica to sync", func() bool {
		info, _ := cr.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	for range 3 {
		ps.sentinels = append(ps.sentinels, startSentinel(t, bin, m.port))
	}
	// Each sentinel must know the replica and the two other sentinels, and
	// see enough of them to authorise a failover: otherwise a test that
	// kills the master would wait for a promotion that cannot come.
	for _, sp := range ps.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sp.addr(), DialTimeout: time.Second})
		t.Cleanup(func() { sc.Close() })
		waitForUpTo(t, 30*time.Second, "sentinel "+sp.addr()+" to know the replica and the other sentinels", func() bool {
			reps, err := sc.Replicas(ctx, sentinelMaster).Result()
			if err != nil || len(reps) != 1 || reps[0]["port"] != strconv.Itoa(r.port) || strings.Contains(reps[0]["flags"], "down") {
				return false
			}
			others, err := sc.Sentinels(ctx, sentinelMaster).Result()
			if err != nil || len(others) != 2 {
				return false
			}
			return sc.CkQuorum(ctx, sentinelMaster).Err() == nil
		})
	}
	return ps
}

// startSentinel starts a sentinel monitoring the master on masterPort and
// waits until it answers.
func startSentinel(t *testing.T, bin string, masterPort int) *sentinelProc {
	t.Helper()
	sp := &sentinelProc{port: freePort(t), dir: t.TempDir()}
	conf := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %[3]s 500
sentinel failover-timeout %[3]s 5000
`, sp.port, sp.dir, sentinelMaster, masterPort)
	path := filepath.Join(sp.dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(sp.dir, "sentinel.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, path, "--sentinel")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	log.Close()
	sp.cmd = cmd
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewSentinelClient(&redis.Options{Addr: sp.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	waitForUpTo(t, 10*time.Second, "sentinel "+sp.addr()+" to start", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	})
	return sp
}

func (ps *privateSentinel) sentinelAddrs() []string {
	var a []string
	for _, sp := range ps.sentinels {
		a = append(a, sp.addr())
	}
	return a
}

// client returns a failover client of the master, found through the
// sentinels, that honours context deadlines.
func (ps *privateSentinel) client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: sentinelMaster, SentinelAddrs: ps.sentinelAddrs(),
		ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// masterAddr returns the master's address as the sentinels report it.
func (ps *privateSentinel) masterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: ps.sentinels[0].addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, sentinelMaster).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name answered %q", hp)
	}
	return hp[0] + ":" + hp[1], nil
}

// waitForUpTo polls cond (bounded by limit) until it holds.
func waitForUpTo(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReplicated returns once the replica has every write the master
// acknowledged so far: WAIT counts the replicas that have the last write
// of its own connection, so it follows a write on the same connection,
// which the master's replication stream carries after all earlier ones.
func waitReplicated(t *testing.T, master *privateServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := master.client(t).Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "idemtest:wait-marker", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Do(ctx, "wait", 1, 0).Int()
	if err != nil || n < 1 {
		t.Fatalf("WAIT 1 0 = %d, %v; want the replica to acknowledge", n, err)
	}
}

// TestConformanceSentinel runs the suite on a store whose client finds the
// master through Sentinel (redis.NewFailoverClient).
func TestConformanceSentinel(t *testing.T) {
	ps := startPrivateSentinel(t)
	c := ps.client(t)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) idempotency.Store {
			return newStore(t, c, Options{Clock: CallerClock})
		},
		// Sentinels that cannot be reached: no master can be found.
		Broken: func(t *testing.T) idempotency.Store {
			c := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: sentinelMaster, SentinelAddrs: []string{closedAddr(t)},
				ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond, MaxRetries: -1,
			})
			t.Cleanup(func() { c.Close() })
			s, err := New(c, &Options{Clock: CallerClock, OpTimeout: time.Second, Logger: discard()})
			if err != nil {
				t.Fatalf("New with unreachable sentinels: %v (must not fail New)", err)
			}
			return s
		},
	})
	// The records are on the master the sentinels name.
	ctx := context.Background()
	s := newStore(t, c, Options{Clock: CallerClock})
	if _, _, err := s.Begin(ctx, "where", "fp", time.Now(), time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := ps.master.client(t).Exists(ctx, s.Key("where")).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS on the master = %d, %v; want the record there", n, err)
	}
}

// TestSentinelFailover kills the master (SIGKILL) while a storm of
// Guard.Do calls runs through a failover client, and the sentinels promote
// the replica. Throughout, no key's fn runs twice at once; every call that
// fails says ErrUnavailable and, unless it had already run fn and failed
// to store its result (Executed with an error, as Guard.Do documents), did
// not run fn; after the promotion calls succeed again through the same
// client; and the results acknowledged and known replicated (WAIT) before
// the kill are replayed, not run again.
func TestSentinelFailover(t *testing.T) {
	ps := startPrivateSentinel(t)
	c := ps.client(t)
	s := newStore(t, c, Options{OpTimeout: time.Second, Logger: discard()})
	g, err := idempotency.NewGuard(s, &idempotency.Options{Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Results acknowledged and replicated before the kill.
	const replicated = 50
	for i := range replicated {
		key := "pre-" + strconv.Itoa(i)
		_, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{Status: 200, Body: []byte(key)}, nil
		})
		if err != nil || out != idempotency.Executed {
			t.Fatalf("Do(%s) before the failover = %s, %v", key, out, err)
		}
	}
	waitReplicated(t, ps.master)

	var (
		mu              sync.Mutex
		running         = map[string]int{} // key -> fn calls under way
		runs            = map[string]int{} // key -> fn calls made
		killed          atomic.Bool
		ackedBeforeKill []string

		overlaps, wrong             atomic.Int32
		unavailable, ranUnsaved     atomic.Int32
		executed, replayed, waiting atomic.Int32
		calls                       atomic.Int64
	)
	bad := func(format string, args ...any) {
		if wrong.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	const maxCalls = 200_000 // the storm is bounded even if stop never came
	stop := underLoad(t, 16, func(string) bool {
		n := calls.Add(1)
		if n > maxCalls {
			return false
		}
		// Four consecutive calls share a key, so that they race for it.
		key := "storm-" + strconv.FormatInt(n/4, 10)
		var ran bool
		resp, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			ran = true
			mu.Lock()
			running[key]++
			runs[key]++
			if running[key] > 1 {
				overlaps.Add(1)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			running[key]--
			mu.Unlock()
			return idempotency.Response{Status: 200, Body: []byte(key)}, nil
		})
		switch {
		case err == nil && out == idempotency.Executed:
			executed.Add(1)
			if !ran {
				bad("Do(%s) = Executed without running fn", key)
			}
			mu.Lock()
			if !killed.Load() {
				ackedBeforeKill = append(ackedBeforeKill, key)
			}
			mu.Unlock()
		case err == nil && out == idempotency.Replayed:
			replayed.Add(1)
			if ran || string(resp.Body) != key {
				bad("Do(%s) = Replayed %q, fn ran: %v", key, resp.Body, ran)
			}
		case errors.Is(err, idempotency.ErrInFlight):
			waiting.Add(1)
			if ran {
				bad("Do(%s) = InFlight after running fn", key)
			}
		case errors.Is(err, idempotency.ErrUnavailable) && out == idempotency.Unavailable:
			unavailable.Add(1)
			if ran {
				bad("Do(%s) failed closed (%v) after running fn", key, err)
			}
			time.Sleep(5 * time.Millisecond) // no busy loop while the master is down
		case errors.Is(err, idempotency.ErrUnavailable) && out == idempotency.Executed && ran:
			// fn ran; storing its result failed.
			ranUnsaved.Add(1)
		default:
			bad("Do(%s) = %s, %v (fn ran: %v); want a result, InFlight or ErrUnavailable", key, out, err, ran)
		}
		return true
	})
	defer stop()
	waitForUpTo(t, 10*time.Second, "the storm to complete some keys", func() bool { return executed.Load() >= 100 })

	mu.Lock()
	killed.Store(true)
	mu.Unlock()
	failsAtKill := unavailable.Load()
	killedAt := time.Now()
	ps.master.kill()

	waitForUpTo(t, 30*time.Second, "the sentinels to promote the replica", func() bool {
		addr, err := ps.masterAddr(ctx)
		return err == nil && addr == ps.replica.addr()
	})
	promoted := time.Since(killedAt)
	base := executed.Load() + replayed.Load()
	waitForUpTo(t, 30*time.Second, "calls to succeed again through the same client", func() bool {
		return executed.Load()+replayed.Load() >= base+100
	})
	recovered := time.Since(killedAt)
	stop()

	t.Logf("promotion %v after the kill, calls succeeding again by %v; %d calls: %d executed, %d replayed, %d in flight, %d unavailable (%d after the kill), %d ran but stored nothing",
		promoted.Round(time.Millisecond), recovered.Round(time.Millisecond), min(calls.Load(), maxCalls),
		executed.Load(), replayed.Load(), waiting.Load(), unavailable.Load(), unavailable.Load()-failsAtKill, ranUnsaved.Load())
	if unavailable.Load() == failsAtKill {
		t.Error("no call failed after the kill: the failover was not seen")
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d times a key's fn ran while another call's fn for it was running", n)
	}

	// What was known replicated is replayed from the new master.
	for i := range replicated {
		key := "pre-" + strconv.Itoa(i)
		resp, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{Status: 500}, nil
		})
		if err != nil || out != idempotency.Replayed || string(resp.Body) != key {
			bad("Do(%s) after the failover = %s %q, %v; want its replicated result replayed", key, out, resp.Body, err)
		}
	}
	// What was only acknowledged may be lost (asynchronous replication);
	// count it, and the keys that ran more than once (one after another).
	lost := 0
	for _, key := range ackedBeforeKill {
		_, out, err := g.Do(ctx, key, "fp", func(context.Context) (idempotency.Response, error) {
			return idempotency.Response{Status: 200, Body: []byte(key)}, nil
		})
		switch {
		case errors.Is(err, idempotency.ErrInFlight):
			// Its claim reached the replica but its result did not: the
			// promoted master holds it in flight until the lease ends.
			lost++
		case err != nil:
			bad("Do(%s) after the failover: %v", key, err)
		case out == idempotency.Executed:
			lost++
		}
	}
	again := 0
	mu.Lock()
	for _, n := range runs {
		if n > 1 {
			again++
		}
	}
	mu.Unlock()
	t.Logf("%d of %d results acknowledged before the kill (not waited for) were lost and ran again; %d storm keys ran more than once",
		lost, len(ackedBeforeKill), again)
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d wrong answers", n)
	}
}
