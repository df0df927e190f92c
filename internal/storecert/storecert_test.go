package storecert

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/internal/verdict"
)

// syncWriter lets the workers' progress lines reach the test log.
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func testOptions() (Options, *syncWriter) {
	w := &syncWriter{}
	seed := time.Now().UnixNano()
	return Options{Seed: seed, Duration: 2 * time.Second, Concurrency: 6, Progress: w}, w
}

func report(rep *verdict.Report) string {
	var b strings.Builder
	_ = rep.Write(&b)
	return b.String()
}

// certifies runs Run on url and requires every check to hold, and the
// campaign's checks to have been exercised.
func certifies(t *testing.T, url string) *verdict.Report {
	t.Helper()
	opts, progress := testOptions()
	rep := verdict.New()
	if err := Run(context.Background(), url, opts, rep); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantCertified(t, rep, opts, progress)
	return rep
}

// wantCertified requires every check of rep to hold, and the campaign's
// checks to have been exercised.
func wantCertified(t *testing.T, rep *verdict.Report, opts Options, progress *syncWriter) {
	t.Helper()
	if !rep.OK() {
		t.Fatalf("Run (seed %d) found violations on a correct store:\n%s\nprogress:\n%s", opts.Seed, report(rep), progress)
	}
	names := map[string]verdict.Check{}
	for _, c := range rep.Checks() {
		names[c.Name] = c
	}
	for _, want := range []string{checkFailClosed, checkNoDouble, checkReplay, checkLinearHist,
		"contract: Fencing/stale-complete-rejected", "contract: Begin/processing-past-lease-takes-over"} {
		if c, ok := names[want]; !ok || c.Passed == 0 {
			t.Errorf("check %q missing or never exercised: %+v", want, c)
		}
	}
	t.Logf("seed %d:\n%s\nprogress:\n%s", opts.Seed, report(rep), progress)
}

func TestRunMemory(t *testing.T) {
	rep := certifies(t, "memory")
	for _, c := range rep.Checks() {
		if c.Name == "contract: Unavailable" && c.Skipped == "" {
			t.Errorf("the memory store has no backend to cut off, yet the Unavailable clauses were not skipped: %+v", c)
		}
	}
}

func TestRunBolt(t *testing.T) {
	rep := certifies(t, "bolt:"+filepath.Join(t.TempDir(), "cert.db"))
	n := 0
	for _, c := range rep.Checks() {
		if strings.HasPrefix(c.Name, "contract: Unavailable/") && c.OK() {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no Unavailable clause held on the closed bolt store")
	}
}

func TestRunRedis(t *testing.T) {
	url := testenv.RedisURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	certifies(t, url+sep+"prefix=storecert-test-"+newRunID()+":")
}

func TestRunPostgres(t *testing.T) {
	url, _ := testenv.PostgresStoreURL(t, "storecert_")
	certifies(t, url)
}

func TestRunUnopenable(t *testing.T) {
	rep := verdict.New()
	for _, url := range []string{"", "nosuch://x", "bolt:"} {
		if err := Run(context.Background(), url, Options{}, rep); err == nil {
			t.Errorf("Run(%q) = nil, want an error: the store cannot be opened", url)
		}
	}
	if len(rep.Checks()) != 0 {
		t.Errorf("Run recorded checks for stores it could not open: %+v", rep.Checks())
	}
}

// staleComplete is a MemoryStore whose Complete ignores the token: a holder
// whose key was taken over overwrites the new holder's claim.
type staleComplete struct{ *idempotency.MemoryStore }

func (s staleComplete) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	if rec, err := s.Get(ctx, key, now); err == nil && rec.State == idempotency.Processing {
		token = rec.Token
	}
	return s.MemoryStore.Complete(ctx, key, token, resp, now, retention)
}

func TestBrokenStoreFails(t *testing.T) {
	s := staleComplete{idempotency.NewMemoryStore()}
	// No faults: the worker mix alone (unrenewed holders that outlive
	// their lease) must find the bug.
	rep, progress, seed := certifyUnfaulted(t, "a store whose Complete ignores the token", s, s)
	if rep.OK() {
		t.Fatalf("the report passed a store whose Complete ignores the token:\n%s", report(rep))
	}
	campaignFailed := false
	for _, c := range rep.Checks() {
		if c.Name == "contract: Fencing/stale-complete-rejected" && c.Failed == 0 {
			t.Errorf("check %q held on a store that ignores the token: %+v", c.Name, c)
		}
		if strings.HasPrefix(c.Name, "campaign: ") && c.Failed > 0 {
			campaignFailed = true
		}
		if c.Name == checkLinearHist {
			t.Logf("the campaign's history check: %d keys held, %d violated", c.Passed, c.Failed)
		}
	}
	// The contract's clause alone is not enough: the campaign must find
	// the bug by itself, from unrenewed holders taken over while they run.
	if !campaignFailed {
		t.Errorf("no campaign check failed on a store whose Complete ignores the token (seed %d):\n%s", seed, report(rep))
	}
	t.Logf("seed %d:\n%s\nprogress:\n%s", seed, report(rep), progress)
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// Hand-made histories for the checker. Times are in milliseconds since an
// arbitrary origin; the caller's clock reads the same.
const ms = int64(time.Millisecond)

func hop(client int, call, ret int64, in input, out output) op {
	in.key = "k"
	if in.kind == opBegin && in.lease == 0 {
		in.lease = time.Second
	}
	if in.nowLo == 0 {
		in.nowLo, in.nowHi = call*ms, call*ms
	}
	o := op{in: in, out: out, call: call * ms, ret: ret * ms, client: client}
	if out.unknown {
		o.ret = math.MaxInt64
	}
	return o
}

func claimOut(token uint64, at int64) output {
	return output{claimed: true, state: idempotency.Processing, fp: "fp", token: token, leaseUntil: at*ms + int64(time.Second)}
}

func TestCheckHistory(t *testing.T) {
	begin := input{kind: opBegin, fp: "fp"}
	complete := func(token uint64, body string) input { return input{kind: opComplete, token: token, body: body} }
	replay := func(body string) output { return output{state: idempotency.Done, fp: "fp", body: body} }
	inflight := func(token uint64) output { return output{state: idempotency.Processing, fp: "fp", token: token} }
	unknown := output{unknown: true, errText: "unavailable"}
	tests := []struct {
		name  string
		ops   []op
		legal bool
	}{
		{"claim-complete-replay", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 3, 4, begin, inflight(5)),
			hop(0, 5, 6, complete(5, "a"), output{}),
			hop(1, 7, 8, begin, replay("a")),
		}, true},
		{"concurrent-claims-one-wins", []op{
			hop(0, 1, 4, begin, claimOut(5, 2)),
			hop(1, 2, 5, begin, inflight(5)),
		}, true},
		{"two-claims-same-token", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 3, 4, begin, claimOut(5, 3)),
		}, false},
		{"two-claims-inside-the-lease", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 3, 4, begin, claimOut(6, 3)),
		}, false},
		{"takeover-after-the-lease", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 1500, 1501, begin, claimOut(6, 1500)),
			hop(0, 1502, 1503, complete(5, "stale"), output{err: errLeaseLost}),
		}, true},
		{"takeover-with-a-smaller-token", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 1500, 1501, begin, claimOut(4, 1500)),
		}, false},
		{"stale-complete-accepted", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 1500, 1501, begin, claimOut(6, 1500)),
			hop(0, 1502, 1503, complete(5, "stale"), output{}),
		}, false},
		{"replay-of-a-result-never-completed", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(1, 3, 4, begin, replay("never stored")),
		}, false},
		{"replay-of-another-result", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, complete(5, "a"), output{}),
			hop(1, 5, 6, begin, replay("b")),
		}, false},
		{"lost-begin-then-in-flight", []op{
			// The claim's answer was lost; a later Begin sees it in flight.
			hop(0, 1, 2, begin, unknown),
			hop(1, 3, 4, begin, inflight(9)),
		}, true},
		{"lost-complete-then-replay", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, complete(5, "a"), unknown),
			hop(1, 5, 6, begin, replay("a")),
		}, true},
		{"lost-complete-not-applied", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, complete(5, "a"), unknown),
			hop(1, 5, 6, begin, inflight(5)),
		}, true},
		{"release-then-reclaim-larger", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, input{kind: opRelease, token: 5}, output{}),
			hop(1, 5, 6, begin, claimOut(6, 5)),
		}, true},
		{"release-then-reclaim-smaller", []op{
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, input{kind: opRelease, token: 5}, output{}),
			hop(1, 5, 6, begin, claimOut(3, 5)),
		}, false},
		{"lost-extend-then-in-flight-server-clock", []op{
			// On the server's clock an unknown Extend may take effect at
			// any instant after its call: the claim may be live for ever.
			hop(0, 1, 2, input{kind: opBegin, fp: "fp", nowLo: 1 * ms, nowHi: 2 * ms}, claimOut(5, 1)),
			hop(0, 400, 401, input{kind: opExtend, token: 5, lease: time.Second, nowLo: 400 * ms, nowHi: math.MaxInt64}, unknown),
			hop(1, 1500, 1501, input{kind: opBegin, fp: "fp", lease: time.Second, nowLo: 1500 * ms, nowHi: 1501 * ms}, inflight(5)),
		}, true},
		{"in-flight-after-the-lease-server-clock", []op{
			hop(0, 1, 2, input{kind: opBegin, fp: "fp", nowLo: 1 * ms, nowHi: 2 * ms}, claimOut(5, 1)),
			hop(1, 1500, 1501, input{kind: opBegin, fp: "fp", lease: time.Second, nowLo: 1500 * ms, nowHi: 1501 * ms}, inflight(5)),
		}, false},
		{"release-lost-ack-reported-lease-lost", []op{
			// A Release that was applied, re-sent by the client and
			// answered ErrLeaseLost by the second send: the key is free
			// though the answer says nothing changed.
			hop(0, 1, 2, begin, claimOut(5, 1)),
			hop(0, 3, 4, input{kind: opRelease, token: 5}, output{err: errLeaseLost}),
			hop(1, 5, 6, begin, claimOut(6, 5)),
		}, false},
		{"begin-answers-its-own-claim-in-flight", []op{
			// A Begin whose first send claimed and whose re-send found
			// the claim: nobody else ever claimed the key.
			hop(0, 1, 2, begin, inflight(5)),
		}, false},
		{"conflict-on-absent-key", []op{
			hop(0, 1, 2, begin, output{state: idempotency.Conflict}),
		}, false},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := checkHistory(tt.ops, 5*time.Second, time.Now().Add(time.Minute), dir)
			if len(res) != 1 {
				t.Fatalf("checkHistory gave %d results, want 1 (one key)", len(res))
			}
			r := res[0]
			if legal := r.result == "Ok"; legal != tt.legal {
				t.Fatalf("result %s, want linearizable = %v", r.result, tt.legal)
			}
			if !tt.legal {
				b, err := os.ReadFile(r.viz)
				if err != nil || !bytes.Contains(b, []byte("<html")) {
					t.Errorf("visualization %q of the illegal history: %v (%d bytes)", r.viz, err, len(b))
				}
			}
		})
	}
}

// TestCampaignFlagsViolation feeds the campaign's report a history with a
// double claim and checks it names the check and the visualization.
func TestCampaignFlagsViolation(t *testing.T) {
	rec := newRecorder(idempotency.NewMemoryStore(), time.Second, false)
	rec.ops = []op{
		hop(0, 1, 2, input{kind: opBegin, fp: "fp"}, claimOut(5, 1)),
		hop(1, 3, 4, input{kind: opBegin, fp: "fp"}, claimOut(5, 3)),
	}
	rep := verdict.New()
	c := &campaign{rec: rec, rep: rep, opts: Options{Duration: time.Second, Visualize: t.TempDir()}}
	c.checkLinearizable()
	out := report(rep)
	if rep.OK() || !strings.Contains(out, checkLinearHist) || !strings.Contains(out, ".html") {
		t.Fatalf("report of a double claim:\n%s", out)
	}
}

// certifyUnfaulted certifies store for 3 s with a campaign that injects no
// faults (the worker mix alone), the contract clauses running on contract,
// and returns the report, the campaign's progress and its seed.
func certifyUnfaulted(t *testing.T, desc string, store, contract idempotency.Store) (*verdict.Report, *syncWriter, int64) {
	t.Helper()
	tgt := &target{desc: desc, contract: contract,
		campaign: func(_ context.Context, seed int64) (*faulty, error) {
			f := injected(store, nopCloser{}, seed, false)
			f.phases = nil
			return f, nil
		}}
	opts, progress := testOptions()
	opts.Duration = 3 * time.Second
	rep := verdict.New()
	if err := certify(context.Background(), tgt, opts, rep); err != nil {
		t.Fatal(err)
	}
	return rep, progress, opts.Seed
}

// A history that porcupine could not decide in time was not verified: it
// must not pass, whether some keys or all went undecided. Here the
// deadline has passed before the check starts, so no key is decided; the
// history itself holds a double claim.
func TestUndecidedHistoryFails(t *testing.T) {
	rec := newRecorder(idempotency.NewMemoryStore(), time.Second, false)
	rec.ops = []op{
		hop(0, 1, 2, input{kind: opBegin, fp: "fp"}, claimOut(5, 1)),
		hop(1, 3, 4, input{kind: opBegin, fp: "fp"}, claimOut(6, 3)),
	}
	rep := verdict.New()
	rep.Pass("contract: a clause that held") // the rest of a certification that passed
	c := &campaign{rec: rec, rep: rep, opts: Options{Duration: time.Second}, historyDeadline: time.Now().Add(-time.Second)}
	c.checkLinearizable()
	out := report(rep)
	if rep.OK() {
		t.Fatalf("a certification whose history was not decided passed:\n%s", out)
	}
	if !strings.Contains(out, "not decided") {
		t.Errorf("the report does not say the history was not decided:\n%s", out)
	}
}
