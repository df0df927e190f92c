// Command idemcheck is fault-injection verification that an API runs each
// Idempotency-Key at most once and replays its first answer.
//
//	idemcheck                         the demo: an orders API behind idemhttp on a
//	                                  bbolt store, paused, SIGKILLed and restarted
//	                                  under retrying clients; the ledger is counted
//	idemcheck -store URL              certify a live store (conformance, faults,
//	                                  linearizability), then run the demo on it
//	idemcheck -target URL [flags]     black-box checks of any HTTP endpoint that
//	                                  claims Idempotency-Key support
//
// It prints progress, a table of checks with counts and the line
// "N passed, M failed", and exits 0 when every check held, 1 when one did
// not or none was judged (with the seed and a command that repeats the
// run) and 2 on usage errors. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/archlab/idempotency/internal/blackbox"
	"github.com/archlab/idempotency/internal/demo"
	"github.com/archlab/idempotency/internal/storecert"
	"github.com/archlab/idempotency/internal/storeurl"
	"github.com/archlab/idempotency/internal/verdict"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// maxDuration is the longest -duration accepted, itself included.
const maxDuration = 50 * time.Second

// config is the parsed command line.
type config struct {
	seed        int64
	seedGiven   bool
	duration    time.Duration
	concurrency int
	verbose     bool

	store     string
	visualize string // -store: where porcupine draws illegal histories ("": nowhere)
	unsafe    bool   // demo: serve without the middleware (hidden, for tests)

	target         string
	headers        []http.Header
	body           string
	conflictStatus int
	requests       int
	timeout        time.Duration
	window         time.Duration
	executions     string
}

// headerSets collects -header and -as in command-line order: headers before
// the first -as apply to every credential set; each -as NAME starts a set
// that the -header flags after it add to.
type headerSets struct {
	common http.Header
	names  []string
	sets   []http.Header
}

func (h *headerSets) String() string { return "" }

func (h *headerSets) addHeader(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") {
		return fmt.Errorf("%q is not 'Name: value'", s)
	}
	dst := h.common
	if len(h.sets) > 0 {
		dst = h.sets[len(h.sets)-1]
	}
	dst.Add(textproto.CanonicalMIMEHeaderKey(name), strings.TrimSpace(value))
	return nil
}

func (h *headerSets) startSet(name string) error {
	if name == "" {
		return errors.New("-as needs a name")
	}
	for _, n := range h.names {
		if n == name {
			return fmt.Errorf("credential set %q given twice", name)
		}
	}
	h.names = append(h.names, name)
	h.sets = append(h.sets, http.Header{})
	return nil
}

// resolve returns one header per credential set, the common headers merged
// in; the first is the default.
func (h *headerSets) resolve() []http.Header {
	if len(h.sets) == 0 {
		return []http.Header{h.common.Clone()}
	}
	out := make([]http.Header, len(h.sets))
	for i, s := range h.sets {
		m := h.common.Clone()
		for k, v := range s {
			m[k] = append([]string(nil), v...)
		}
		out[i] = m
	}
	return out
}

type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

func parse(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{}
	hs := &headerSets{common: http.Header{}}
	fs := flag.NewFlagSet("idemcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage:
  idemcheck [-seed N] [-duration D] [-concurrency N] [-v]
            [-store URL [-visualize DIR]]        demo (with -store: certify the store first)
  idemcheck -target URL [-as NAME] [-header 'Name: value']... [-body TEMPLATE]
            [-conflict-status 422|409] [-requests N] [-concurrency N] [-timeout D]
            [-window D] [-executions URL] [-seed N]

Exit status: 0 when every check held, 1 when one did not or none was judged
(or the run could not be carried out), 2 on a usage error.

Credential sets for -target: -header flags before any -as go to every
request; each -as NAME starts a set, and the -header flags after it belong to
that set. Give two sets to check that callers never share a result:
  idemcheck -target http://127.0.0.1:8080/orders \
    -header 'Content-Type: application/json' \
    -as alice -header 'Authorization: Bearer A' \
    -as bob   -header 'Authorization: Bearer B'

flags:
`)
		fs.VisitAll(func(f *flag.Flag) {
			if f.Usage == "" {
				return // hidden
			}
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(stderr, "  -%s\n    \t%s", strings.TrimSpace(f.Name+" "+name), usage)
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
				fmt.Fprintf(stderr, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(stderr)
		})
	}
	fs.Int64Var(&cfg.seed, "seed", 0, "seed of every random choice (default: time-based, printed)")
	fs.DurationVar(&cfg.duration, "duration", 0, "demo: how long to send load (default 20s, at most "+maxDuration.String()+")")
	fs.IntVar(&cfg.concurrency, "concurrency", 0, "demo: concurrent clients (default 8); target: concurrent duplicates per key, 2 to 256 (default 16)")
	fs.BoolVar(&cfg.verbose, "v", false, "verbose: the demo server's log on stderr")
	fs.StringVar(&cfg.store, "store", "", "store `URL` (memory, bolt:PATH, redis://..., redis+cluster://..., redis+sentinel://..., postgres://...): certify it, then run the demo on it")
	fs.StringVar(&cfg.visualize, "visualize", "", "store: write porcupine's drawing of each key history that is not linearizable into `DIR`, an existing directory (default: none written)")
	fs.BoolVar(&cfg.unsafe, "unsafe-demo", false, "")
	fs.StringVar(&cfg.target, "target", "", "black-box mode: the `URL` to POST to")
	fs.Func("header", "target: a request `header` 'Name: value' (repeatable; see -as)", hs.addHeader)
	fs.Func("as", "target: start a credential set `NAME`; the -header flags after it belong to it", hs.startSet)
	fs.StringVar(&cfg.body, "body", `{"sku":"sku-1","qty":1,"cents":1299,"ref":"{{unique}}"}`,
		"target: JSON body template; {{unique}} and {{seq}} are replaced per request")
	fs.IntVar(&cfg.conflictStatus, "conflict-status", 422, "target: the status expected for a key reused with another payload (422 or 409)")
	fs.IntVar(&cfg.requests, "requests", 20, "target: logical requests (keys) per check")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Second, "target: per-request timeout")
	fs.StringVar(&cfg.executions, "executions", "", "target: `URL` of the target's execution counter (GET answers the number of times its operation has run)")
	fs.DurationVar(&cfg.window, "window", blackbox.DefaultWindow, "target: how long after its first answer a key must still replay (retried once at the end)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.seedGiven = set["seed"]
	if !cfg.seedGiven {
		cfg.seed = time.Now().UnixNano() % 1_000_000_000
	}
	var bad []string
	badf := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	if cfg.duration < 0 || cfg.duration > maxDuration {
		badf("-duration %v: give at most %v (0: the default)", cfg.duration, maxDuration)
	}
	if set["concurrency"] && (cfg.concurrency < 1 || cfg.concurrency > 256) {
		badf("-concurrency %d: give 1 to 256", cfg.concurrency)
	}
	if cfg.visualize != "" {
		switch fi, err := os.Stat(cfg.visualize); {
		case cfg.store == "":
			badf("-visualize needs -store: it draws the store certification's histories")
		case err != nil:
			badf("-visualize %s: %v", cfg.visualize, err)
		case !fi.IsDir():
			badf("-visualize %s: not a directory", cfg.visualize)
		}
	}
	if cfg.target == "" {
		if cfg.store != "" {
			if err := checkStore(cfg.store); err != nil {
				badf("-store %s: %v", storeurl.Redact(cfg.store), err)
			}
		}
		targetOnly := map[string]bool{"header": true, "as": true, "body": true, "conflict-status": true, "requests": true, "timeout": true,
			"window": true, "executions": true}
		fs.Visit(func(f *flag.Flag) {
			if targetOnly[f.Name] {
				badf("-%s needs -target", f.Name)
			}
		})
	} else {
		u, err := url.Parse(cfg.target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			badf("-target %q: give an http:// or https:// URL", cfg.target)
		}
		if cfg.store != "" {
			badf("-store and -target are two modes; give one")
		}
		if cfg.executions != "" {
			if u, err := url.Parse(cfg.executions); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				badf("-executions %q: give an http:// or https:// URL", cfg.executions)
			}
		}
		if cfg.unsafe {
			badf("-unsafe-demo is for the demo")
		}
		if set["duration"] {
			// Silently ignored, it would promise a bound it does not set.
			badf("-duration is for the demo; -target sends -requests keys per check, each exchange bounded by -timeout")
		}
		if cfg.conflictStatus != 422 && cfg.conflictStatus != 409 {
			badf("-conflict-status %d: give 422 or 409", cfg.conflictStatus)
		}
		if cfg.requests < 1 {
			badf("-requests %d: give at least 1", cfg.requests)
		}
		if cfg.timeout <= 0 {
			badf("-timeout %v: give a positive duration", cfg.timeout)
		}
		if cfg.window <= 0 || cfg.window > 10*time.Minute {
			badf("-window %v: give 1ms to 10m", cfg.window)
		}
		if !strings.Contains(cfg.body, "{{unique}}") && !strings.Contains(cfg.body, "{{seq}}") {
			badf("-body needs {{unique}} or {{seq}}, so that every request is a new operation")
		}
		if cfg.concurrency == 1 {
			badf("-concurrency %d: with -target it is the number of duplicates sent at once; give 2 to 256", cfg.concurrency)
		}
		cfg.headers = hs.resolve()
	}
	if len(bad) > 0 {
		return nil, usageError{errors.New(strings.Join(bad, "; "))}
	}
	if cfg.duration == 0 && cfg.target == "" {
		cfg.duration = 20 * time.Second
	}
	if cfg.concurrency == 0 && cfg.target == "" {
		cfg.concurrency = 8 // with -target, 0 is blackbox's own default
	}
	return cfg, nil
}

// checkStore returns why the run would refuse the -store URL raw, so that
// it is refused with the arguments rather than after other work: what
// storeurl.Open refuses before connecting (the certification replaces
// clock= for its contract checks, so a bad one used to surface only when
// its campaign opened the store), and a redis:// or postgres:// URL that
// names no single host:port, which the campaign puts a proxy in front of.
func checkStore(raw string) error {
	if err := storeurl.Check(raw); err != nil {
		return err
	}
	raw = strings.TrimSpace(raw)
	scheme, _, _ := strings.Cut(raw, ":")
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "postgres", "postgresql":
		if u, err := url.Parse(raw); err == nil && (u.Host == "" || strings.Contains(u.Host, ",")) {
			return errors.New("certifying the store puts a proxy in front of it, so the URL must name one host:port (not several hosts, nor a socket)")
		}
	}
	return nil
}

// run is the whole command. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == demo.ServeCommand {
		if err := demo.Serve(ctx, args[1:], os.Stdin, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "idemcheck:", err)
			return exitFail
		}
		return exitOK
	}
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemcheck:", err)
		fmt.Fprintln(stderr, "run 'idemcheck -h' for usage")
		return exitUsage
	}
	fmt.Fprintf(stdout, "idemcheck: seed %d\n", cfg.seed)
	rep := verdict.New()
	prog := newProgress(stdout)
	if cfg.target != "" {
		err = runTargetMode(ctx, cfg, rep, prog)
	} else {
		err = runDemoMode(ctx, cfg, rep, prog, stderr)
	}
	prog.finish()
	fmt.Fprintln(stdout)
	if werr := rep.Write(stdout); werr != nil && err == nil {
		err = werr
	}
	if err == nil {
		err = judged(rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemcheck:", err)
	}
	if err != nil || !rep.OK() {
		fmt.Fprintf(stdout, "\nFAILED with seed %d; repeat the run with:\n  %s\n", cfg.seed, repro(cfg, args))
		return exitFail
	}
	return exitOK
}

// errNothingJudged is the failure of a run whose report judged nothing.
var errNothingJudged = errors.New("no check was judged (none ran, or every one was skipped): " +
	"nothing about exactly-once was verified, so the run does not pass")

// judged returns errNothingJudged if rep has no check that held or failed:
// "0 passed, 0 failed" is no success.
func judged(rep *verdict.Report) error {
	if passed, failed := rep.Counts(); passed == 0 && failed == 0 {
		return errNothingJudged
	}
	return nil
}

func runDemoMode(ctx context.Context, cfg *config, rep *verdict.Report, prog *progress, stderr io.Writer) error {
	if cfg.store != "" {
		fmt.Fprintf(prog.w, "certifying store %s\n", storeurl.Redact(cfg.store))
		if err := storecert.Run(ctx, cfg.store, storecert.Options{Seed: cfg.seed, Duration: cfg.duration,
			Concurrency: cfg.concurrency, Progress: prog.lines(), Visualize: cfg.visualize}, rep); err != nil {
			return fmt.Errorf("store certification: %w", err)
		}
		prog.finish()
		fmt.Fprintln(prog.w, "running the demo campaign on it")
	}
	opts := demo.Options{Seed: cfg.seed, Duration: cfg.duration, Concurrency: cfg.concurrency,
		StoreURL: cfg.store, Unsafe: cfg.unsafe, Progress: prog.demo,
		Log: func(format string, args ...any) { fmt.Fprintf(prog.lines(), "  * "+format+"\n", args...) }}
	if cfg.verbose {
		opts.ServerLog = stderr
	}
	return demo.Run(ctx, opts, rep)
}

func runTargetMode(ctx context.Context, cfg *config, rep *verdict.Report, prog *progress) error {
	fmt.Fprintf(prog.w, "checking %s with %d credential set(s)\n", cfg.target, len(cfg.headers))
	return blackbox.Run(ctx, blackbox.Config{Target: cfg.target, Headers: cfg.headers, BodyTemplate: cfg.body,
		ConflictStatus: cfg.conflictStatus, Concurrency: cfg.concurrency, Seed: cfg.seed,
		Timeout: cfg.timeout, Requests: cfg.requests, Window: cfg.window, Executions: cfg.executions}, rep, prog.lines())
}

// repro is the command that repeats the run: the same flags, the seed
// fixed, and secrets hidden (a URL's password, the value of a header that
// carries credentials), since the line goes to logs; they show as xxxxx,
// to be put back by whoever repeats the run.
func repro(cfg *config, args []string) string {
	parts := []string{"go", "run", "./cmd/idemcheck", "-seed", strconv.FormatInt(cfg.seed, 10)}
	skip := false
	prev := ""
	for _, a := range args {
		if skip {
			skip = false
			continue
		}
		name := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && (name == "seed" || strings.HasPrefix(name, "seed=")) {
			skip = name == "seed"
			continue
		}
		flagName, value, inline := strings.Cut(name, "=")
		switch {
		case !strings.HasPrefix(a, "-"):
			a = hideSecret(prev, a)
		case inline:
			a = a[:len(a)-len(value)] + hideSecret(flagName, value)
		}
		prev = ""
		if strings.HasPrefix(a, "-") && !inline {
			prev = flagName
		}
		parts = append(parts, shellQuote(a))
	}
	if cfg.target == "" && !strings.Contains(strings.Join(args, " "), "-duration") {
		parts = append(parts, "-duration", cfg.duration.String())
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@,+%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hideSecret hides what the value of flag may hold of a secret: a URL's
// password (-store, -target) or a credential header's value (-header).
func hideSecret(flag, value string) string {
	switch flag {
	case "store", "target", "executions":
		return storeurl.Redact(value)
	case "header":
		name, _, ok := strings.Cut(value, ":")
		if ok && secretHeader(strings.TrimSpace(name)) {
			return name + ": xxxxx"
		}
	}
	return value
}

// secretHeader reports whether a header of this name carries credentials.
func secretHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	for _, part := range []string{"token", "secret", "key", "auth", "password", "session"} {
		if strings.Contains(n, part) && n != "idempotency-key" {
			return true
		}
	}
	return false
}
