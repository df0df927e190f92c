package blackbox

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency/idemhttp"
)

// shaky is a third set of broken targets: an idempotent endpoint (keys
// parsed per the draft, scoped by Authorization, replays marked, 422 for
// another body) whose operation and record keeping can be made wrong.
type shaky struct {
	// answer renders an execution's answer: n counts executions.
	answer func(key string, body []byte, n int64) []byte
	// claimless: look up, run (taking 20ms), store; no claim in between,
	// and the stored result is the first one stored.
	claimless bool
	// wipeAfter: the records are lost (a restart of a server on a memory
	// store) once this many executions have run (0: never).
	wipeAfter int64
	// emptyMark: replays carry the field with an empty value.
	emptyMark bool
	// noMark: replays are not marked.
	noMark bool
	// ownResult: with claimless, each runner answers its own execution.
	ownResult bool
	// located: the created order is named by Location only, the body is
	// the same bytes for every execution.
	located bool
	// goneKeeps499: the status line goes out at once, the body after
	// 50ms; a client gone by then has its record replaced by a 499
	// (client closed request), though the operation ran and its answer
	// was sent: the retry is told, as a replay, that nothing was done.
	goneKeeps499 bool

	runs atomic.Int64

	mu      sync.Mutex
	wiped   bool
	records map[string]shakyRecord
}

type shakyRecord struct {
	fp       [32]byte
	status   int // 0: 201
	body     []byte
	location string
}

func (s *shaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, key, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")

	s.mu.Lock()
	if s.records == nil {
		s.records = map[string]shakyRecord{}
	}
	rec, ok := s.records[id]
	if !ok && !s.claimless {
		// Claimed under the lock: the operation is quick.
		rec = s.record(fp, s.execute(key, body))
		s.records[id] = rec
		if rec.location != "" {
			w.Header().Set("Location", rec.location)
		}
		w.WriteHeader(http.StatusCreated)
		if s.goneKeeps499 {
			// Still under the lock: a retry waits for the record.
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
			if r.Context().Err() != nil {
				s.records[id] = shakyRecord{fp: fp, status: 499, body: []byte(`{"error":"client closed request"}`)}
			}
		}
		s.mu.Unlock()
		_, _ = w.Write(rec.body)
		return
	}
	s.mu.Unlock()
	if ok {
		s.replay(w, rec, fp)
		return
	}
	rec = s.record(fp, s.execute(key, body))
	time.Sleep(20 * time.Millisecond) // the window in which duplicates run too
	s.mu.Lock()
	if prev, ok := s.records[id]; ok && !s.ownResult {
		rec = prev // first stored wins, and every runner answers it
	} else if !ok {
		s.records[id] = rec
	}
	s.mu.Unlock()
	if rec.location != "" {
		w.Header().Set("Location", rec.location)
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(rec.body)
}

// record is the record of an execution's answer.
func (s *shaky) record(fp [32]byte, out []byte) shakyRecord {
	if !s.located {
		return shakyRecord{fp: fp, body: out}
	}
	return shakyRecord{fp: fp, body: []byte(`{"status":"created"}`), location: fmt.Sprintf("/orders/ord_%d", s.runs.Load())}
}

// execute runs the operation; the caller may hold s.mu.
func (s *shaky) execute(key string, body []byte) []byte {
	n := s.runs.Add(1)
	if s.wipeAfter > 0 && n == s.wipeAfter {
		go func() {
			s.mu.Lock()
			s.records, s.wiped = map[string]shakyRecord{}, true
			s.mu.Unlock()
		}()
	}
	return s.answer(key, body, n)
}

func (s *shaky) replay(w http.ResponseWriter, rec shakyRecord, fp [32]byte) {
	if rec.fp != fp {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	}
	if rec.location != "" {
		w.Header().Set("Location", rec.location)
	}
	switch {
	case s.noMark:
	case s.emptyMark:
		w.Header()[ReplayedHeader] = []string{""}
	default:
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(cmp.Or(rec.status, http.StatusCreated))
	_, _ = w.Write(rec.body)
}

// orderID answers a new order per execution.
func orderID(_ string, body []byte, n int64) []byte {
	return fmt.Appendf(nil, `{"order":"ord_%d","request":%s}`, n, body)
}

// constant answers the same bytes whatever ran.
func constant(string, []byte, int64) []byte { return []byte(`{"ok":true}`) }

// keyDigest answers an order whose id is derived from the key (a digest of
// it, not the key itself), nothing unique to the execution.
func keyDigest(key string, _ []byte, _ int64) []byte {
	d := sha256.Sum256([]byte(key))
	return fmt.Appendf(nil, `{"order":"ord_%s"}`, hex.EncodeToString(d[:8]))
}

// A claimless target runs concurrent duplicates each, and answers all of
// them with the first stored result. Its answers carry nothing unique per
// execution, but it marks replays: duplicates answered as first answers
// (2xx, unmarked) by a target that marks its replays are executions.
func TestConcurrentRunsSeenByMarks(t *testing.T) {
	for name, answer := range map[string]func(string, []byte, int64) []byte{
		"same bytes":      constant,
		"id from the key": keyDigest,
		"order per run":   orderID,
	} {
		t.Run(name, func(t *testing.T) {
			s := &shaky{answer: answer, claimless: true}
			rep := run(t, testConfig(serve(t, s)))
			if !containsName(failed(rep), CheckConcurrent) {
				t.Errorf("%q did not fail for a target that ran %d times; failed: %v, skipped: %v",
					CheckConcurrent, s.runs.Load(), failed(rep), skipped(rep))
			}
		})
	}
}

// A target that loses its records mid-run (restarted on a memory store)
// runs answered keys again.
func TestWipedMidRun(t *testing.T) {
	for _, after := range []int64{5, 12, 18, 24} {
		t.Run(fmt.Sprint(after), func(t *testing.T) {
			s := &shaky{answer: orderID, wipeAfter: after}
			rep := run(t, testConfig(serve(t, s)))
			if rep.OK() {
				t.Errorf("report OK for a target that lost its records after %d of %d executions", after, s.runs.Load())
			}
		})
	}
}

// A correct target whose answers are the same bytes whatever ran, but that
// marks replays: nothing fails, and its marks let the concurrent check run.
func TestCorrectMarkedConstant(t *testing.T) {
	rep := run(t, testConfig(serve(t, &shaky{answer: constant})))
	wantFailed(t, rep)
	for _, c := range rep.Checks() {
		if c.Name == CheckConcurrent && !c.OK() {
			t.Errorf("%q did not run and hold: %+v", CheckConcurrent, c)
		}
	}
}

// Replays with an empty Idempotent-Replayed are unmarked replays.
func TestEmptyMark(t *testing.T) {
	rep := run(t, testConfig(serve(t, &shaky{answer: orderID, emptyMark: true})))
	wantFailed(t, rep)
	if s := skipped(rep); s[CheckMarked] == "" {
		t.Errorf("%q not skipped for a target whose marks are empty: %v", CheckMarked, s)
	}
}

// The middleware on a MemoryStore passes every time, with and without
// waiting duplicates.
func TestMiddlewarePassesRepeatedly(t *testing.T) {
	for i := range 5 {
		for name, opts := range map[string]*idemhttp.Options{"409": nil, "wait": {Wait: time.Second}} {
			t.Run(fmt.Sprintf("%s/%d", name, i), func(t *testing.T) {
				h, err := guarded(opts)
				if err != nil {
					t.Fatal(err)
				}
				cfg := testConfig(serve(t, h))
				cfg.Seed = int64(i)
				wantAllHeld(t, run(t, cfg))
			})
		}
	}
}

// A correct target that names the created order in Location and answers a
// body that is the same for every execution identifies its executions: a
// second one would be visible, and nothing fails.
func TestLocatedCorrect(t *testing.T) {
	for name, noMark := range map[string]bool{"marked": false, "unmarked": true} {
		t.Run(name, func(t *testing.T) {
			rep := run(t, testConfig(serve(t, &shaky{answer: orderID, located: true, noMark: noMark})))
			wantFailed(t, rep)
			for _, c := range rep.Checks() {
				if (c.Name == CheckConcurrent || c.Name == CheckScope) && !c.OK() {
					t.Errorf("%q did not run and hold: %+v", c.Name, c)
				}
			}
		})
	}
}

// The same target without a claim runs concurrent duplicates each time,
// each answered its own order's Location. (Were every runner answered the
// first stored order, unmarked, nothing outside could tell.)
func TestLocatedClaimless(t *testing.T) {
	s := &shaky{answer: orderID, located: true, noMark: true, claimless: true, ownResult: true}
	rep := run(t, testConfig(serve(t, s)))
	if !containsName(failed(rep), CheckConcurrent) {
		t.Errorf("%q did not fail for a target that ran %d times; failed: %v, skipped: %v",
			CheckConcurrent, s.runs.Load(), failed(rep), skipped(rep))
	}
}

// A target that keeps, for a request whose client left after the status
// line came, a record saying the client closed the request (499), though
// the operation ran and its 201 was sent, replays that record, marked, to
// the retry: the client is told nothing was done. What the lost request
// was answered is known (its status line after a cut, the whole answer
// after a half-close), and a marked replay must be that answer, whether
// or not the target's answers identify executions.
func TestLostReplayIsNotTheAnswerSent(t *testing.T) {
	for name, answer := range map[string]func(string, []byte, int64) []byte{
		"same bytes":    constant,
		"order per run": orderID,
	} {
		t.Run(name, func(t *testing.T) {
			rep := run(t, testConfig(serve(t, &shaky{answer: answer, goneKeeps499: true})))
			wantFailed(t, rep, CheckLost)
			ex := example(rep, CheckLost)
			for _, way := range []string{lostNames[cutAfterStatus], lostNames[leftWhileRunning]} {
				if !strings.Contains(ex, way) || !strings.Contains(ex, "499") {
					t.Errorf("lost response examples do not name the 499 replayed after %q:\n%s", way, ex)
				}
			}
		})
	}
}
