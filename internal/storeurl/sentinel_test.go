package storeurl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// parseSentinel parses a sentinel store URL as parse does.
func parseSentinel(raw string) (*redis.FailoverOptions, map[string]string, error) {
	scheme, rest, _ := strings.Cut(raw, ":")
	return sentinelOptions(scheme, rest)
}

func TestSentinelURL(t *testing.T) {
	// The fields of FailoverOptions the URL sets.
	type want struct {
		Master, User, Password, SentinelUser, SentinelPassword string
		Addrs                                                  []string
		DB                                                     int
		DialTimeout, ReadTimeout                               time.Duration
		PoolSize                                               int
		TLS, SkipVerify                                        bool
		ServerName                                             string
		Params                                                 map[string]string
	}
	for _, tc := range []struct {
		name, raw string
		want      want
	}{
		{"minimal", "redis+sentinel://10.0.0.1:26379/mymaster",
			want{Master: "mymaster", Addrs: []string{"10.0.0.1:26379"}, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"several sentinels, db", "redis+sentinel://s1:26379,s2:26380,s3:26381/mymaster/3",
			want{Master: "mymaster", Addrs: []string{"s1:26379", "s2:26380", "s3:26381"}, DB: 3, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"default port", "redis+sentinel://s1,s2:1,[::1]/m/",
			want{Master: "m", Addrs: []string{"s1:26379", "s2:1", "[::1]:26379"}, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"credentials and options", "redis+sentinel://app:s3cret@s1:1,s2:2/orders/2?prefix=o:&clock=caller&dial_timeout=2s&read_timeout=500ms&pool_size=7&sentinel_username=sen&sentinel_password=sp",
			want{Master: "orders", User: "app", Password: "s3cret", SentinelUser: "sen", SentinelPassword: "sp",
				Addrs: []string{"s1:1", "s2:2"}, DB: 2, DialTimeout: 2 * time.Second, ReadTimeout: 500 * time.Millisecond, PoolSize: 7,
				Params: map[string]string{"prefix": "o:", "clock": "caller", "sentinel_username": "sen", "sentinel_password": "sp"}}},
		{"password only, encoded", "redis+sentinel://:p%40ss%2Fw@s1:1/m",
			want{Master: "m", Password: "p@ss/w", Addrs: []string{"s1:1"}, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"encoded master name", "redis+sentinel://s1:1/my%2Fmaster%20a/0",
			want{Master: "my/master a", Addrs: []string{"s1:1"}, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"numeric master with a db", "redis+sentinel://s1:1/0/1",
			want{Master: "0", Addrs: []string{"s1:1"}, DB: 1, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"upper-case scheme", "REDIS+SENTINEL://s1:1/m",
			want{Master: "m", Addrs: []string{"s1:1"}, DialTimeout: 5 * time.Second, Params: map[string]string{}}},
		{"tls", "rediss+sentinel://sentinel.example:1,s2:2/m",
			want{Master: "m", Addrs: []string{"sentinel.example:1", "s2:2"}, DialTimeout: 5 * time.Second, TLS: true, ServerName: "sentinel.example", Params: map[string]string{}}},
		{"tls skip_verify", "rediss+sentinel://s1:1/m?skip_verify=true",
			want{Master: "m", Addrs: []string{"s1:1"}, DialTimeout: 5 * time.Second, TLS: true, SkipVerify: true, ServerName: "s1",
				Params: map[string]string{"skip_verify": "true"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Check(tc.raw); err != nil {
				t.Fatalf("Check: %v", err)
			}
			fo, p, err := parseSentinel(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			got := want{Master: fo.MasterName, User: fo.Username, Password: fo.Password,
				SentinelUser: fo.SentinelUsername, SentinelPassword: fo.SentinelPassword,
				Addrs: fo.SentinelAddrs, DB: fo.DB, DialTimeout: fo.DialTimeout, ReadTimeout: fo.ReadTimeout,
				PoolSize: fo.PoolSize, TLS: fo.TLSConfig != nil, Params: p}
			if fo.TLSConfig != nil {
				got.SkipVerify, got.ServerName = fo.TLSConfig.InsecureSkipVerify, fo.TLSConfig.ServerName
				if fo.TLSConfig.MinVersion < tls.VersionTLS12 {
					t.Errorf("MinVersion = %x; want TLS 1.2 at least", fo.TLSConfig.MinVersion)
				}
				if verified := !fo.TLSConfig.InsecureSkipVerify; verified != (fo.Dialer != nil) {
					t.Errorf("Dialer set: %v; want a per-node verifying dialer exactly when certificates are verified", fo.Dialer != nil)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
			if !fo.ContextTimeoutEnabled {
				t.Error("ContextTimeoutEnabled is off")
			}
		})
	}
}

func TestSentinelURLErrors(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct{ name, raw, want string }{
		{"no master", "redis+sentinel://s1:1", "names no master"},
		{"no master, slash", "redis+sentinel://s1:1/", "names no master"},
		{"no master, query", "redis+sentinel://s1:1?prefix=a:", "names no master"},
		{"db without master", "redis+sentinel://s1:1,s2:2/0", "/0 is a database number"},
		{"empty master", "redis+sentinel://s1:1//2", "names no master"},
		{"no sentinel", "redis+sentinel:///m", "names no sentinel"},
		{"no slashes", "redis+sentinel:s1:1/m", "must look like"},
		{"db not a number", "redis+sentinel://s1:1/m/x", `database "x" is not a number`},
		{"negative db", "redis+sentinel://s1:1/m/-1", `database "-1" is not a number`},
		{"too many segments", "redis+sentinel://s1:1/m/0/1", "3 segments"},
		{"bad address", "redis+sentinel://s1:1,s2:2:3/m", `"s2:2:3" is not host[:port]`},
		{"bare IPv6", "redis+sentinel://s1:1,::1/m", `"::1" is not host[:port]`},
		{"empty host", "redis+sentinel://s1:1,:2/m", `":2" is not host[:port]`},
		{"master_name", "redis+sentinel://s1:1/m?master_name=n", `"master_name"`},
		{"addr", "redis+sentinel://s1:1/m?addr=s2:2", `"addr"`},
		{"db param", "redis+sentinel://s1:1/m?db=1", `"db"`},
		{"password param", "redis+sentinel://s1:1/m?password=x", `"password"`},
		{"username param", "redis+sentinel://s1:1/m?username=x", `"username"`},
		{"replica_only", "redis+sentinel://s1:1/m?replica_only=true", "needs the master"},
		{"route_randomly", "redis+sentinel://s1:1/m?route_randomly=true", "needs the master"},
		{"route_by_latency", "redis+sentinel://s1:1/m?route_by_latency=true", "needs the master"},
		{"sentinel user without password", "redis+sentinel://s1:1/m?sentinel_username=u", "needs sentinel_password"},
		{"unknown option", "redis+sentinel://s1:1/m?bogus=1", "unexpected option: bogus"},
		{"bad duration", "redis+sentinel://s1:1/m?dial_timeout=soon", "dial_timeout"},
		{"empty prefix", "redis+sentinel://s1:1/m?prefix=", `"prefix" is empty`},
		{"twice", "redis+sentinel://s1:1/m?sentinel_password=a&sentinel_password=b", "given 2 times"},
		{"bad clock", "redis+sentinel://s1:1/m?clock=wall", `clock="wall"`},
		{"tls param without tls", "redis+sentinel://s1:1/m?skip_verify=true", "redis+sentinel:// does not use"},
		{"ca file missing", "rediss+sentinel://s1:1/m?tls_ca_file=" + url.QueryEscape(caFile), "cannot be read"},
		{"ca file and skip_verify", "rediss+sentinel://s1:1/m?skip_verify=true&tls_ca_file=x", "contradict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.raw)
			if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check(%q) = %v; want ErrInvalidConfig saying %s", tc.raw, err, tc.want)
			}
			if err2 := wantInvalid(t, tc.raw); err2 != nil && err2.Error() != err.Error() {
				t.Errorf("Open's error %q differs from Check's %q", err2, err)
			}
		})
	}
}

// TestSentinelURLHidesPasswords: a password that ends the authority early
// is not quoted back, nor is a sentinel_password when the URL is refused
// for something else.
func TestSentinelURLHidesPasswords(t *testing.T) {
	for _, raw := range []string{
		"redis+sentinel://u:S3CR/ETX@127.0.0.1:1,127.0.0.1:2/m",
		"redis+sentinel://u:S3CR#ETX@127.0.0.1:1,127.0.0.1:2/m",
		"redis+sentinel://u:S3CR?ETX@127.0.0.1:1,127.0.0.1:2/m",
		"redis+sentinel://:1234?S3CRETX@127.0.0.1:1/m",
		"redis+sentinel://:1234/S3CRETX@127.0.0.1:1/m",
		"rediss+sentinel://u:S3CR/ETX@127.0.0.1:1/m/0",
	} {
		err := wantInvalid(t, raw)
		if err == nil {
			continue
		}
		for _, secret := range []string{"S3CR", "ETX", "1234"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q) error quotes the password: %v", raw, err)
			}
		}
		if !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("Open(%q) = %v; want it to say to percent-encode the password", raw, err)
		}
	}
	for _, raw := range []string{
		"redis+sentinel://u:S3CRET@127.0.0.1:1/m?sentinel_password=S3CRET&bogus=1",
		"redis+sentinel://u:S3CRET@127.0.0.1:1/m?sentinel_password=S3CRET&replica_only=1",
		"redis+sentinel://u:S3CRET@127.0.0.1:1?sentinel_password=S3CRET",
	} {
		if err := wantInvalid(t, raw); err != nil && strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("Open(%q) error quotes a password: %v", raw, err)
		}
	}
	if got, want := Redact("redis+sentinel://u:pw@s1:1,s2:2/m/0?sentinel_password=sp&prefix=a:"),
		"redis+sentinel://u:xxxxx@s1:1,s2:2/m/0?sentinel_password=xxxxx&prefix=a:"; got != want {
		t.Errorf("Redact = %q; want %q", got, want)
	}
}

// startSentinelSetup starts a private master, requiring masterPass, on
// 127.0.0.1 and one sentinel monitoring it as "m", requiring
// sentinelPass, and returns the sentinel's address and the master's.
func startSentinelSetup(t *testing.T, masterPass, sentinelPass string) (sentinel, master string) {
	t.Helper()
	bin := testenv.Binary(t, "redis-server")
	mport, sport := freePortOn(t, "127.0.0.1"), freePortOn(t, "127.0.0.1")
	mdir, sdir := t.TempDir(), t.TempDir()
	start := func(dir, what string, args ...string) { startProcess(t, bin, dir, what, args...) }
	start(mdir, "redis", "--port", strconv.Itoa(mport), "--bind", "127.0.0.1", "--dir", mdir, "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--maxmemory-policy", "noeviction",
		"--requirepass", masterPass)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nrequirepass %s\n"+
		"sentinel monitor m 127.0.0.1 %d 1\nsentinel auth-pass m %s\n", sport, sdir, sentinelPass, mport, masterPass)
	confFile := filepath.Join(sdir, "sentinel.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	start(sdir, "sentinel", confFile, "--sentinel")
	sentinel, master = "127.0.0.1:"+strconv.Itoa(sport), "127.0.0.1:"+strconv.Itoa(mport)
	waitSentinel(t, &redis.Options{Addr: sentinel, Password: sentinelPass}, sdir, master)
	return sentinel, master
}

// startProcess starts bin with args, logging to dir/what.log, killed at
// cleanup.
func startProcess(t *testing.T, bin, dir, what string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	log, err := os.Create(filepath.Join(dir, what+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	log.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// waitSentinel waits (bounded) until the sentinel that o reaches, logging
// in dir, names master as the master "m".
func waitSentinel(t *testing.T, o *redis.Options, dir, master string) {
	t.Helper()
	o.MaxRetries, o.DialTimeout = -1, time.Second
	sc := redis.NewSentinelClient(o)
	defer sc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		hp, err := sc.GetMasterAddrByName(ctx, "m").Result()
		cancel()
		if err == nil && len(hp) == 2 && hp[0]+":"+hp[1] == master {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("private sentinel on %s does not name the master %s: %v, %v\n%s", o.Addr, master, hp, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSentinelOpen opens a store through a private sentinel: the user
// info authenticates to the master, sentinel_password to the sentinel,
// and the records land in the URL's database on the master the sentinel
// names.
func TestSentinelOpen(t *testing.T) {
	sentinel, master := startSentinelSetup(t, "master-pw", "sentinel-pw")
	prefix := unique(t) + ":"
	base := "redis+sentinel://:master-pw@" + sentinel + "/m/2?max_retries=-1&dial_timeout=2s&prefix=" + prefix

	t.Run("open", func(t *testing.T) {
		s := open(t, base+"&sentinel_password=sentinel-pw", Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, _, err := s.Begin(ctx, "where", "fp", time.Now(), time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
		mc := redis.NewClient(&redis.Options{Addr: master, Password: "master-pw", DB: 2, MaxRetries: -1})
		defer mc.Close()
		if n, err := mc.Exists(ctx, prefix+"where").Result(); err != nil || n != 1 {
			t.Fatalf("EXISTS %swhere in db 2 of the master = %d, %v; want the record there", prefix, n, err)
		}
		roundTrip(t, s, "k")
	})
	// Each password goes to its own server: swapped or left out, no
	// master is reached, and the store fails closed.
	for name, raw := range map[string]string{
		"no sentinel_password":    base,
		"wrong sentinel_password": base + "&sentinel_password=master-pw",
		"wrong master password":   strings.Replace(base, ":master-pw@", ":sentinel-pw@", 1) + "&sentinel_password=sentinel-pw",
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t, raw, Options{Logger: discardLogger()})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := s.Get(ctx, "k", time.Now()); !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("Get = %v; want ErrUnavailable", err)
			}
		})
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestSentinelTLS opens a rediss+sentinel store whose sentinel (on
// 127.0.0.1) and master (on 127.0.0.2, as the sentinel announces it) each
// carry a certificate from a private CA naming their own IP alone: with
// tls_ca_file= both are verified, the master against the address the
// sentinel gave (go-redis alone would hold it to the URL's host); without
// it neither is trusted.
func TestSentinelTLS(t *testing.T) {
	bin := testenv.Binary(t, "redis-server")
	ca := testenv.NewCA(t, "storeurl test CA")
	m := startTLSNode(t, bin, "127.0.0.2", ca, false)
	dir := t.TempDir()
	certFile, keyFile := testenv.WritePEM(t, dir, ca.Issue(t, "127.0.0.1", "127.0.0.1"))
	caFile := writeCAFile(t, ca)
	port := freePortOn(t, "127.0.0.1")
	conf := fmt.Sprintf("port 0\ntls-port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
		"tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\n"+
		"sentinel monitor m %s %d 1\n", port, dir, certFile, keyFile, caFile, m.ip, m.port)
	confFile := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, bin, dir, "sentinel", confFile, "--sentinel")
	sentinel := "127.0.0.1:" + strconv.Itoa(port)
	waitSentinel(t, &redis.Options{Addr: sentinel, TLSConfig: &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}}, dir, m.addr())

	base := "rediss+sentinel://" + sentinel + "/m?max_retries=-1&dial_timeout=2s&prefix=" + unique(t) + ":"
	t.Run("with tls_ca_file", func(t *testing.T) {
		roundTrip(t, open(t, base+"&tls_ca_file="+url.QueryEscape(caFile), Options{}), "k")
	})
	t.Run("without", func(t *testing.T) {
		// go-redis keeps asking the sentinels until the deadline, so the
		// certificate's error does not come through; the store fails closed.
		if err := firstOp(t, base); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("a sentinel store of a private CA, without tls_ca_file = %v; want ErrUnavailable", err)
		}
	})
	t.Run("skip_verify", func(t *testing.T) {
		roundTrip(t, open(t, base+"&skip_verify=true", Options{}), "k")
	})
}
