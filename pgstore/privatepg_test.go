package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency/internal/testenv"
)

// privatePG is a PostgreSQL server of the test's own, on a free loopback
// port, that the test may kill, restart, pause and resume: the shared
// server must never be touched. Its postmaster runs in a process group of
// its own; signals go to it and to each of its children, as a crash or a
// frozen host would.
type privatePG struct {
	t        testing.TB
	postgres string
	dir      string // data directory (and socket directory)
	port     int
	cred     *syscall.Credential // nil: run as ourselves
	cmd      *exec.Cmd
	exited   chan struct{}
	paused   bool
}

// startPrivatePG initializes a data directory and starts a server on it,
// stopped (SIGKILL to its group, after a SIGCONT) when t ends.
func startPrivatePG(t testing.TB) *privatePG {
	t.Helper()
	if testing.Short() {
		t.Skip("private PostgreSQL server: not in -short")
	}
	initdb := testenv.Binary(t, "initdb")
	p := &privatePG{t: t, postgres: testenv.Binary(t, "postgres")}
	// PostgreSQL refuses to run as root: run it as the postgres user then.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Missing(t, "running as root and there is no postgres user to run a private server as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base, err := os.MkdirTemp("", "pgstore-private-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	p.dir = filepath.Join(base, "data")
	if p.cred != nil {
		if err := os.Chmod(base, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(base, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(initdb, "-D", p.dir, "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	p.Start()
	t.Cleanup(func() {
		if p.cmd != nil {
			p.signal(syscall.SIGCONT)
			p.Kill()
		}
	})
	return p
}

// URL is the server's connection string.
func (p *privatePG) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Start starts the server on its data directory (again, after Kill: it
// then recovers from its WAL like after a crash) and waits until it takes
// connections.
func (p *privatePG) Start() {
	p.t.Helper()
	if p.cmd != nil {
		p.t.Fatal("private server already running")
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		cmd := exec.Command(p.postgres, "-D", p.dir, "-p", strconv.Itoa(p.port), "-k", p.dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=60",
			"-c", "shared_buffers=16MB", "-c", "logging_collector=off")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
		logf, err := os.Create(filepath.Join(filepath.Dir(p.dir), "postgres.log"))
		if err != nil {
			p.t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			p.t.Fatalf("starting postgres: %v", err)
		}
		logf.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		p.cmd, p.exited, p.paused = cmd, exited, false
		if lastErr = p.waitReady(exited); lastErr == nil {
			return
		}
		// The backends of a killed server may still be exiting and
		// holding its shared memory, and the new postmaster then exits at
		// once ("pre-existing shared memory block is still in use"): try
		// again shortly. Kill only one still running: signalling one that
		// has exited failed the test instead.
		select {
		case <-exited:
			p.cmd = nil
		default:
			p.Kill()
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(filepath.Dir(p.dir), "postgres.log"))
	p.t.Fatalf("private postgres did not start: %v\n%s", lastErr, log)
}

func (p *privatePG) waitReady(exited chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, p.URL())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signal sends sig to the postmaster and to each of its children. A
// process group would not do: every child of the postmaster calls setsid.
// The postmaster is stopped first, and its children listed only once it
// is: stopped, it forks no child unseen, and it cannot die before its
// children are signalled (the children of a postmaster that SIGKILL has
// already ended belong to init, and listing them by parent misses them: a
// backend would outlive the crash).
func (p *privatePG) signal(sig syscall.Signal) {
	if p.cmd == nil {
		p.t.Fatalf("private server not running (signal %v)", sig)
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		state := "running"
		select {
		case <-p.exited:
			state = p.cmd.ProcessState.String()
		default:
		}
		log, _ := os.ReadFile(filepath.Join(filepath.Dir(p.dir), "postgres.log"))
		p.t.Fatalf("stopping the private postmaster: %v (%s); its log:\n%s", err, state, log)
	}
	waitStopped(p.t, pid)
	for _, child := range childPids(pid) {
		_ = syscall.Kill(child, sig) // it may have exited meanwhile
	}
	if err := syscall.Kill(pid, sig); err != nil {
		p.t.Fatalf("signal %v to the private postmaster: %v", sig, err)
	}
}

// waitStopped waits (bounded) until the process pid is stopped: kill
// returns before the signal has taken effect.
func waitStopped(t testing.TB, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("private postmaster: %v", err)
		}
		// pid (comm) state ...; comm may hold spaces and parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("private postmaster %d not stopped 10s after SIGSTOP", pid)
		}
	}
}

// childPids lists the processes whose parent is pid, from /proc.
func childPids(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
			pids = append(pids, child)
		}
	}
	return pids
}

// Kill kills the postmaster and every backend at once (SIGKILL) and waits
// for the postmaster to be gone: a crash.
func (p *privatePG) Kill() {
	p.t.Helper()
	p.signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.t.Fatal("private postgres did not exit 10s after SIGKILL")
	}
	p.cmd = nil
}

// Pause stops every process of the server (SIGSTOP): connections stay
// open and the kernel still accepts new ones, but nothing answers.
func (p *privatePG) Pause() { p.t.Helper(); p.signal(syscall.SIGSTOP); p.paused = true }

// Resume lets a paused server go on (SIGCONT).
func (p *privatePG) Resume() { p.t.Helper(); p.signal(syscall.SIGCONT); p.paused = false }

// Pool is a pool on the server of at most maxConns connections, closed
// when t ends. configure, unless nil, adjusts its configuration first.
func (p *privatePG) Pool(maxConns int32, configure func(*pgxpool.Config)) *pgxpool.Pool {
	p.t.Helper()
	cfg, err := pgxpool.ParseConfig(p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() {
		// A pool closes its connections politely; let a paused server
		// answer first.
		if p.paused {
			p.Resume()
		}
		pool.Close()
	})
	return pool
}
