package blackbox

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/verdict"
)

// Targets that are wrong in ways a lenient checker lets through. Each is a
// correct idempotent endpoint (keys parsed per the draft, scoped by the
// Authorization field, claimed atomically, replays marked, 409 in flight,
// 422 for another body) with one defect switched on.
type lenient struct {
	// waiters200: a duplicate that arrives while the key is in flight
	// waits for the result and gets its body with 200, not the first
	// answer's 201.
	waiters200 bool
	// window: a result is forgotten this long after it was stored (0:
	// never), and the key runs again.
	window time.Duration
	// echoKey: the answer names the key and the request, nothing unique to
	// the execution; and the claim is check-then-act, so concurrent
	// duplicates all run.
	echoKey bool
	// strangerGets200: a key used by another caller answers that caller
	// with the stored body under 200, unmarked (the resource "as a GET
	// would show it").
	strangerGets200 bool
	// validateOnly: the key's fingerprint is kept, so another body is
	// answered 422, but the response is not: every retry runs again, and
	// every answer is the same bytes.
	validateOnly bool
	// dropHeaders: replays lose the first answer's Content-Type and
	// Location.
	dropHeaders bool
	// goneDiscard: the operation takes a while; if the client has gone
	// by the end of it, the key is released and nothing answered, so that
	// the retry runs again.
	goneDiscard bool

	// crowd: a request that finds this many requests for its key under
	// way (itself included) runs without a claim, as if a pool of
	// crowd-1 claim slots were exhausted.
	crowd int
	// checkThenAct: the key is looked up, the operation run (taking this
	// long) and the result stored, with no claim in between.
	checkThenAct time.Duration
	// busyForever: once a key is answered, it is answered 409 for ever.
	busyForever bool
	// rawKey: the field's value is the key as it comes, quotes and all; no
	// value is refused.
	rawKey bool
	// storeLate: the answer is sent first and the result stored this long
	// after (as a middleware that stores when the response has finished):
	// the key answers 409 meanwhile. Correct.
	storeLate time.Duration
	// resultsByKey: claims and fingerprints are per caller and key, but
	// results are kept per key alone, the first stored winning: a second
	// caller runs its own request, and its retries replay the first
	// caller's result.
	resultsByKey bool
	// goneRefused: the operation starts after a while; a request whose
	// client has gone by then is answered 499 (client closed request),
	// neither run nor kept. Correct.
	goneRefused bool

	runs    atomic.Int64 // executions of the operation
	replays atomic.Int64 // marked replays served

	mu       sync.Mutex
	records  map[string]*lenientRecord
	underWay map[string]int
	byKey    map[string][]byte // resultsByKey: the first result stored per key
}

type lenientRecord struct {
	fp       [32]byte
	done     chan struct{} // closed when the result is stored
	status   int
	body     []byte
	storedAt time.Time
	owner    string
	location string
}

func newLenient(l *lenient) *lenient {
	l.records = map[string]*lenientRecord{}
	l.underWay = map[string]int{}
	l.byKey = map[string][]byte{}
	return l
}

func (s *lenient) execute(key string, body []byte) []byte {
	n := s.runs.Add(1)
	if s.echoKey {
		time.Sleep(20 * time.Millisecond) // the window in which duplicates slip through
		return fmt.Appendf(nil, `{"order":%q,"request":%s}`, key, body)
	}
	if s.validateOnly {
		return []byte(`{"ok":true}`)
	}
	if s.waiters200 {
		time.Sleep(30 * time.Millisecond) // long enough for duplicates to wait
	}
	return fmt.Appendf(nil, `{"order":"ord_%d","request":%s}`, n, body)
}

func (s *lenient) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key, err := idemhttp.ParseKey(r.Header["Idempotency-Key"])
	if s.rawKey {
		key, err = r.Header.Get("Idempotency-Key"), nil
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	caller := r.Header.Get("Authorization")
	id := caller + "\x00" + key
	if s.strangerGets200 {
		id = key
	}
	fp := sha256.Sum256(body)
	if s.crowd > 0 {
		s.mu.Lock()
		s.underWay[id]++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.underWay[id]--
			s.mu.Unlock()
		}()
		time.Sleep(5 * time.Millisecond) // the claim takes a while to get a slot
		s.mu.Lock()
		n := s.underWay[id]
		s.mu.Unlock()
		if n >= s.crowd {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(s.execute(key, body))
			return
		}
	}
	if s.checkThenAct > 0 {
		s.mu.Lock()
		rec, ok := s.records[id]
		s.mu.Unlock()
		if ok {
			s.answer(w, rec, fp, caller)
			return
		}
		out := s.execute(key, body)
		time.Sleep(s.checkThenAct)
		rec = &lenientRecord{fp: fp, done: make(chan struct{}), status: http.StatusCreated, body: out, storedAt: time.Now(),
			owner: caller, location: "/orders/" + key}
		close(rec.done)
		s.mu.Lock()
		s.records[id] = rec
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", rec.location)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
		return
	}

	s.mu.Lock()
	rec, ok := s.records[id]
	if ok && s.window > 0 && !rec.storedAt.IsZero() && time.Since(rec.storedAt) > s.window {
		delete(s.records, id)
		ok = false
	}
	if ok {
		s.mu.Unlock()
		s.answer(w, rec, fp, caller)
		return
	}
	rec = &lenientRecord{fp: fp, done: make(chan struct{}), owner: caller, location: "/orders/" + key}
	if !s.echoKey && !s.validateOnly {
		s.records[id] = rec // claimed atomically
	}
	s.mu.Unlock()

	if s.goneRefused {
		time.Sleep(100 * time.Millisecond)
		if r.Context().Err() != nil {
			s.mu.Lock()
			delete(s.records, id)
			s.mu.Unlock()
			w.WriteHeader(499)
			_, _ = io.WriteString(w, `{"error":"client closed request"}`)
			return
		}
	}
	out := s.execute(key, body)
	if s.goneDiscard {
		time.Sleep(300 * time.Millisecond)
		if r.Context().Err() != nil {
			s.mu.Lock()
			delete(s.records, id)
			s.mu.Unlock()
			panic(http.ErrAbortHandler)
		}
	}
	rec.status, rec.body = http.StatusCreated, out
	s.mu.Lock()
	rec.storedAt = time.Now()
	if _, ok := s.byKey[key]; !ok && s.resultsByKey {
		s.byKey[key] = out
	}
	if s.resultsByKey {
		rec.body = s.byKey[key]
	}
	if s.validateOnly {
		rec.body = nil // the fingerprint only
		if _, ok := s.records[id]; !ok {
			s.records[id] = rec
		}
	}
	if s.echoKey {
		if _, ok := s.records[id]; !ok {
			s.records[id] = rec
		}
	}
	s.mu.Unlock()
	if s.storeLate > 0 {
		time.AfterFunc(s.storeLate, func() { close(rec.done) })
	} else {
		close(rec.done)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", rec.location)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

func (s *lenient) answer(w http.ResponseWriter, rec *lenientRecord, fp [32]byte, caller string) {
	if s.storeLate > 0 {
		select {
		case <-rec.done:
		default:
			// Nothing is known of the key but that it is in flight.
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":"in flight"}`)
			return
		}
	}
	if rec.fp != fp {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	}
	if s.validateOnly {
		// Runs again; the answer is the same bytes as ever.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", rec.location)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(s.execute("", nil))
		return
	}
	select {
	case <-rec.done:
		if s.busyForever {
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":"in flight"}`)
			return
		}
	default:
		if !s.waiters200 {
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":"in flight"}`)
			return
		}
		<-rec.done
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(rec.body)
		return
	}
	if s.strangerGets200 && caller != rec.owner {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(rec.body)
		return
	}
	if !s.dropHeaders {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", rec.location)
	}
	s.replays.Add(1)
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// reviewConfig is testConfig with a short window check, where it exists.
func reviewConfig(target string) Config {
	cfg := testConfig(target)
	return cfg
}

// Concurrent duplicates that wait for the holder and are then answered 200,
// where the first answer was 201, do not get "the first answer".
func TestConcurrentWaitersGetAnotherStatus(t *testing.T) {
	rep := run(t, reviewConfig(serve(t, newLenient(&lenient{waiters200: true}))))
	if !containsName(failed(rep), CheckConcurrent) {
		t.Errorf("%q held for a target that answers waiting duplicates 200 where the first answer was 201", CheckConcurrent)
	}
}

// A target that forgets a key shortly after it answered runs the key again:
// its window is shorter than the run, and a retry late in it must show it.
func TestShortWindow(t *testing.T) {
	rep := run(t, reviewConfig(serve(t, newLenient(&lenient{window: 200 * time.Millisecond}))))
	if !containsName(failed(rep), CheckRetry) {
		t.Errorf("%q held for a target that forgets every key 200ms after answering it", CheckRetry)
	}
}

// A target whose answer names the key (the resource id is the key) but
// nothing unique to the execution runs concurrent duplicates more than once
// unseen: its answers must not be taken to identify executions.
func TestAnswerEchoesKey(t *testing.T) {
	s := newLenient(&lenient{echoKey: true})
	rep := run(t, reviewConfig(serve(t, s)))
	for _, c := range rep.Checks() {
		if c.Name == CheckConcurrent && c.OK() {
			t.Errorf("%q held (%d) for a check-then-act target whose answers only echo the key; it ran %d times for %d keys",
				CheckConcurrent, c.Passed, s.runs.Load(), len(s.records))
		}
	}
}

// A target that answers another caller's request on a used key with the
// first caller's body (under another status) leaks the result.
func TestStrangerGetsTheBody(t *testing.T) {
	rep := run(t, reviewConfig(serve(t, newLenient(&lenient{strangerGets200: true}))))
	if !containsName(failed(rep), CheckScope) {
		t.Errorf("%q held for a target that gives the second caller the first caller's body", CheckScope)
	}
}

// A target that keeps fingerprints but not responses runs every retry, and
// answers the same bytes every time: an equal retry is no replay.
func TestEqualBytesAreNoReplay(t *testing.T) {
	s := newLenient(&lenient{validateOnly: true})
	rep := run(t, reviewConfig(serve(t, s)))
	for _, c := range rep.Checks() {
		if c.Name == CheckRetry && c.OK() {
			t.Errorf("%q held (%d) for a target that ran every one of %d requests", CheckRetry, c.Passed, s.runs.Load())
		}
	}
	// Nothing else can see it either: the run must not pass.
	if rep.OK() {
		t.Errorf("the report passed a target that ran every one of %d requests", s.runs.Load())
	}
	if !containsName(failed(rep), CheckVisible) {
		t.Errorf("%q held for a target whose answers never differ and that never marks a replay", CheckVisible)
	}
}

// Replays that lose the first answer's Content-Type and Location are not
// the first answer.
func TestReplayLosesHeaders(t *testing.T) {
	rep := run(t, reviewConfig(serve(t, newLenient(&lenient{dropHeaders: true}))))
	if !containsName(failed(rep), CheckRetry) {
		t.Errorf("%q held for a target whose replays drop Content-Type and Location", CheckRetry)
	}
}

// A target that forgets a request whose client left while it ran, and
// answers the retry with a new execution, earns no held observation for
// it: only retries known to be replays count.
func TestLostThenRanAgainIsNotHeld(t *testing.T) {
	s := newLenient(&lenient{goneDiscard: true})
	target := serve(t, s)
	cfg := reviewConfig(target)
	cfg.Requests = 3 // one lost request per way of losing it
	c, err := newChecker(cfg, verdict.New(), logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	c.markedReplays = 1 // the target marks its replays (CheckRetry would have shown it)
	c.identifies = true
	c.checkLost(t.Context())
	for _, ch := range c.rep.Checks() {
		if ch.Name == CheckLost && int64(ch.Passed) > s.replays.Load() {
			t.Errorf("%q held %d times, but the target served only %d replays; %d executions for 3 keys",
				CheckLost, ch.Passed, s.replays.Load(), s.runs.Load())
		}
	}
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// Targets with defects the checker already catches, each by the check that
// must name it: a record of what was tried.
func TestCaught(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target *lenient
		cfg    func(*Config)
		want   string
	}{
		// Runs twice only when 8 requests for one key are under way.
		{"twice under a crowd of 8", &lenient{crowd: 8}, nil, CheckConcurrent},
		{"twice under a crowd of 8, 16 duplicates", &lenient{crowd: 8}, func(c *Config) { c.Concurrency = 16 }, CheckConcurrent},
		// Check-then-act with an operation of 1ms: a small window.
		{"check-then-act, 1ms", &lenient{checkThenAct: time.Millisecond}, nil, CheckConcurrent},
		// Safe, useless: after the first answer only 409.
		{"409 for ever", &lenient{busyForever: true}, func(c *Config) { c.Timeout = 300 * time.Millisecond }, CheckRetry},
		// The field taken as it comes: lists, parameters, broken strings.
		{"no key syntax", &lenient{rawKey: true}, nil, CheckMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := reviewConfig(serve(t, newLenient(tc.target)))
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			rep := run(t, cfg)
			if !containsName(failed(rep), tc.want) {
				t.Errorf("%q held; failed: %v", tc.want, failed(rep))
			}
		})
	}
}

// A target that keeps results per key alone, though it claims per caller,
// runs a second caller's request, then replays the first caller's result
// to the second caller's retries.
func TestSecondCallerRetryGetsFirstResult(t *testing.T) {
	rep := run(t, testConfig(serve(t, newLenient(&lenient{resultsByKey: true}))))
	if !containsName(failed(rep), CheckScope) {
		t.Errorf("%q held for a target that replays the first caller's result to the second caller's retry; failed: %v",
			CheckScope, failed(rep))
	}
}

// Targets that answer every request with one status: none may pass, nor
// may the checks that compare answers hold on refusals (a refusal repeated
// is no replay), and the run ends without a timeout per key.
func TestOneStatusForAll(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusServiceUnavailable, http.StatusInternalServerError,
		http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			cfg := testConfig(serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(status)
			})))
			cfg.Timeout = 300 * time.Millisecond
			rep := run(t, cfg)
			if !containsName(failed(rep), CheckFresh) || rep.OK() {
				t.Errorf("a target answering %d to everything: failed %v", status, failed(rep))
			}
			for _, c := range rep.Checks() {
				if c.OK() && (c.Name == CheckRetry || c.Name == CheckVisible) {
					t.Errorf("%q held (%d) for a target answering %d to everything", c.Name, c.Passed, status)
				}
			}
		})
	}
}
