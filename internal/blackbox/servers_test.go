package blackbox

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// The servers the checker is tested against: correct ones, which must pass,
// and broken ones, each with one defect that a named check must flag.

// orders is the operation behind every server: it creates an order with a
// fresh id, so that two executions always answer different bodies.
type orders struct{ n atomic.Int64 }

func (o *orders) create(body []byte) []byte {
	return fmt.Appendf(nil, `{"order":"ord_%d","request":%s}`, o.n.Add(1), body)
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(o.create(body))
}

// sameAnswer does not deduplicate and answers the same bytes every time:
// double execution is invisible to a black box.
func sameAnswer(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

// toy is a hand-written idempotent server whose flaws can be switched on.
// With none it is correct: keys parsed per the draft (400 if malformed),
// scoped by the Authorization header, claimed and executed under one lock,
// replays marked, another body on a used key answered 422.
type toy struct {
	// ignorePayload replays the stored answer whatever the body.
	ignorePayload bool
	// checkThenAct looks the key up, runs the operation without holding any
	// claim, then stores the result: duplicates arriving meanwhile run too.
	checkThenAct bool
	// forgetGone runs the operation, then stores nothing when the client
	// has gone meanwhile: the retry after a lost answer runs again.
	forgetGone bool
	// rerun runs the operation again for every replay, then answers the
	// stored result, marked: the answers are those of a correct server.
	rerun bool

	ops     orders
	mu      sync.Mutex
	records map[string]toyRecord
}

type toyRecord struct {
	fingerprint [32]byte
	body        []byte
}

func (s *toy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _, fp, body, ok := toyRequest(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if s.rerun {
		s.mu.Lock()
		rec, ok := s.records[id]
		s.mu.Unlock()
		if ok && rec.fingerprint == fp {
			s.ops.create(body)
		}
	}
	if s.checkThenAct {
		s.mu.Lock()
		rec, ok := s.records[id]
		s.mu.Unlock()
		if ok {
			s.answer(w, rec, fp)
			return
		}
		time.Sleep(20 * time.Millisecond) // the window in which duplicates slip through
		out := s.ops.create(body)
		s.mu.Lock()
		s.records[id] = toyRecord{fp, out}
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.records[id]; ok {
		s.answer(w, rec, fp)
		return
	}
	out := s.ops.create(body)
	if s.forgetGone {
		time.Sleep(30 * time.Millisecond) // the operation takes a while
		if r.Context().Err() != nil {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(out)
			return
		}
	}
	s.records[id] = toyRecord{fp, out}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

func (s *toy) answer(w http.ResponseWriter, rec toyRecord, fp [32]byte) {
	if rec.fingerprint != fp && !s.ignorePayload {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"key reused with another body"}`)
		return
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(rec.body)
}

// flaws switches a toy's defects on.
type flaws struct{ ignorePayload, checkThenAct, forgetGone, rerun bool }

func newToy(f flaws) *toy {
	return &toy{ignorePayload: f.ignorePayload, checkThenAct: f.checkThenAct, forgetGone: f.forgetGone, rerun: f.rerun,
		records: map[string]toyRecord{}}
}

// guarded is the orders handler behind our idemhttp middleware on a
// MemoryStore.
func guarded(opts *idemhttp.Options) (http.Handler, error) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		return nil, err
	}
	m, err := idemhttp.New(g, opts)
	if err != nil {
		return nil, err
	}
	return m.Handler(&orders{}), nil
}

// guardedOps is ops behind our idemhttp middleware on a MemoryStore.
func guardedOps(ops *orders) (http.Handler, error) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		return nil, err
	}
	m, err := idemhttp.New(g, nil)
	if err != nil {
		return nil, err
	}
	return m.Handler(ops), nil
}

// toyRequest reads what the toy servers key and fingerprint a request by:
// the caller and key (id), the key, the body's SHA-256 and the body. On a
// bad request it answers 400 and reports false.
func toyRequest(w http.ResponseWriter, r *http.Request) (id, key string, fp [32]byte, body []byte, ok bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return "", "", fp, nil, false
	}
	key, err = idemhttp.ParseKey(r.Header["Idempotency-Key"])
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return "", "", fp, nil, false
	}
	return r.Header.Get("Authorization") + "\x00" + key, key, sha256.Sum256(body), body, true
}
