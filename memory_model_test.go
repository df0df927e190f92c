package idempotency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// modelRec is what a key holds in reviewModel.
type modelRec struct {
	fp                    string
	done                  bool
	token                 uint64
	leaseUntil, expiresAt int64
	resp                  Response
}

// reviewModel is Begin's contract written out plainly: a record that has
// expired is as good as absent to Begin and Get.
type reviewModel struct {
	recs   map[string]*modelRec
	tokens uint64
}

func (m *reviewModel) live(key string, n int64) *modelRec {
	if r := m.recs[key]; r != nil && n < r.expiresAt {
		return r
	}
	return nil
}

// begin returns what Begin must answer, as a Record.
func (m *reviewModel) begin(key, fp string, n int64, lease, retention time.Duration) (Record, bool) {
	r := m.live(key, n)
	switch {
	case r == nil:
		m.tokens++
		r = &modelRec{fp: fp, token: m.tokens, leaseUntil: n + int64(lease), expiresAt: n + int64(retention)}
		m.recs[key] = r
		return Record{Fingerprint: fp, State: Processing, Token: r.token, LeaseUntil: unixTime(r.leaseUntil), ExpiresAt: unixTime(r.expiresAt)}, true
	case r.fp != fp:
		return Record{State: Conflict, Fingerprint: r.fp, ExpiresAt: unixTime(r.expiresAt)}, false
	case r.done:
		return Record{Fingerprint: fp, State: Done, Token: r.token, ExpiresAt: unixTime(r.expiresAt), Response: r.resp}, false
	case n < r.leaseUntil:
		return Record{Fingerprint: fp, State: Processing, Token: r.token, LeaseUntil: unixTime(r.leaseUntil), ExpiresAt: unixTime(r.expiresAt)}, false
	}
	m.tokens++
	r.token = m.tokens
	r.leaseUntil = n + int64(lease)
	r.expiresAt = max(r.expiresAt, r.leaseUntil)
	return Record{Fingerprint: fp, State: Processing, Token: r.token, LeaseUntil: unixTime(r.leaseUntil), ExpiresAt: unixTime(r.expiresAt)}, true
}

// resultOf turns a Begin answer into the Result the Guard builds from it,
// the way Guard.run's Store.Begin path does.
func resultOf(rec Record, claimed bool) Result {
	if claimed {
		return Result{Token: rec.Token}
	}
	switch rec.State {
	case Done:
		return Result{Response: rec.Response, Outcome: Replayed, ExpiresAt: rec.ExpiresAt}
	case Conflict:
		return Result{Outcome: Conflicted}
	}
	return Result{Outcome: InFlight, LeaseUntil: rec.LeaseUntil}
}

// checkShards checks what every shard must hold between operations: each
// live record found through the index at its own position, the index's
// count of used slots exact and under three quarters, free positions
// zeroed, one due queue entry standing for each live record, and Len
// equal to the live records.
func checkShards(t *testing.T, s *MemoryStore) {
	t.Helper()
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		used, indexed := 0, 0
		for _, v := range sh.slots {
			if v == 0 {
				continue
			}
			used++
			if uint32(v) != slotDeleted {
				indexed++
				if p := int(uint32(v)) - 1; p >= len(sh.recs) || sh.recs[p].state == 0 {
					t.Fatalf("shard %d: slot names position %d, which holds no record", i, p)
				}
			}
		}
		if used != sh.used {
			t.Fatalf("shard %d: %d slots used, used says %d", i, used, sh.used)
		}
		if len(sh.slots) > 0 && used*4 > len(sh.slots)*3 {
			t.Fatalf("shard %d: %d of %d slots used", i, used, len(sh.slots))
		}
		isFree := map[int32]bool{}
		for _, p := range sh.free {
			if isFree[p] {
				t.Fatalf("shard %d: position %d freed twice", i, p)
			}
			isFree[p] = true
			if sh.recs[p].state != 0 {
				t.Fatalf("shard %d: free position %d holds %q", i, p, sh.recs[p].key)
			}
		}
		queued := map[string]map[int64]bool{}
		for _, e := range sh.exp {
			if queued[e.key] == nil {
				queued[e.key] = map[int64]bool{}
			}
			queued[e.key][e.at] = true
		}
		live := 0
		for p := range sh.recs {
			r := &sh.recs[p]
			if r.state == 0 {
				if !isFree[int32(p)] {
					t.Fatalf("shard %d: empty position %d is not free", i, p)
				}
				continue
			}
			live++
			if got := sh.get(r.hash, r.key); got != r {
				t.Fatalf("shard %d: %q at position %d not found through the index", i, r.key, p)
			}
			if r.queuedAt > r.expiresAt || !queued[r.key][r.queuedAt] {
				t.Fatalf("shard %d: %q expires at %d, queued at %d, in the queue: %v", i, r.key, r.expiresAt, r.queuedAt, queued[r.key])
			}
		}
		if live != indexed {
			t.Fatalf("shard %d: %d records, %d indexed", i, live, indexed)
		}
		total += live
		sh.mu.Unlock()
	}
	if s.Len() != total {
		t.Fatalf("Len %d, %d records held", s.Len(), total)
	}
}

// TestMemoryModel drives two MemoryStores with one random history,
// one through Begin and one through the Guard's beginResult, against
// reviewModel. Keys come from a pool large enough for shards to reindex and
// compact, with bursts that expire together. Time never goes backwards, so
// the model need not know when the store sweeps. Set MEMORY_MODEL_SEED to replay
// a failing seed.
func TestMemoryModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("MEMORY_MODEL_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (MEMORY_MODEL_SEED=%d go test -run TestMemoryModel .)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	viaBegin, viaResult := NewMemoryStore(), NewMemoryStore()
	m := &reviewModel{recs: map[string]*modelRec{}}
	n := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC).UnixNano()
	const unit = int64(time.Millisecond)
	steps := 60_000
	if testing.Short() {
		steps = 10_000
	}
	burst := ""
	for step := range steps {
		switch {
		case step%8000 == 0:
			// A burst of new keys, claimed at one time and left to expire
			// together, so that shards grow, then reindex and compact as
			// writes sweep the burst away.
			burst = fmt.Sprint("b", step, "-")
			for i := range 12_000 + rng.IntN(8_000) {
				key := burst + strconv.Itoa(i)
				want, _ := m.begin(key, "a", n, time.Millisecond, 30*time.Millisecond)
				for _, s := range []*MemoryStore{viaBegin, viaResult} {
					if _, ok, err := s.Begin(ctx, key, "a", time.Unix(0, n), time.Millisecond, 30*time.Millisecond); !ok || err != nil {
						t.Fatalf("seed %d: burst Begin(%s) = %v %v, want %+v", seed, key, ok, err, want)
					}
				}
			}
		case rng.IntN(50) == 0:
			n += rng.Int64N(200) * unit
		default:
			n += rng.Int64N(3) * unit
		}
		key := "k" + strconv.Itoa(rng.IntN(200))
		if rng.IntN(4) == 0 {
			key = burst + strconv.Itoa(rng.IntN(20_000))
		}
		fp := []string{"a", "b"}[rng.IntN(8)/7]
		lease := time.Duration(1+rng.IntN(20)) * time.Millisecond
		retention := lease + time.Duration(rng.IntN(100))*time.Millisecond
		now := time.Unix(0, n)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d step %d key %s: %s", seed, step, key, fmt.Sprintf(format, args...))
		}
		switch op := rng.IntN(10); {
		case op < 5:
			want, wantClaimed := m.begin(key, fp, n, lease, retention)
			got, claimed, err := viaBegin.Begin(ctx, key, fp, now, lease, retention)
			if err != nil || claimed != wantClaimed || !reflect.DeepEqual(got, want) {
				fail("Begin = %+v %v %v, want %+v %v", got, claimed, err, want, wantClaimed)
			}
			var res Result
			claimed, err = viaResult.beginResult(key, fp, n, nil, lease, retention, &res)
			if wantRes := resultOf(want, wantClaimed); err != nil || claimed != wantClaimed || !reflect.DeepEqual(res, wantRes) {
				fail("beginResult = %+v %v %v, want %+v %v", res, claimed, err, wantRes, wantClaimed)
			}
		case op < 7: // Complete: with the current token on a live record, else a stale one
			r := m.live(key, n)
			if r == nil || r.done {
				for _, s := range []*MemoryStore{viaBegin, viaResult} {
					if err := s.Complete(ctx, key, m.tokens+1, Response{}, now, retention); err == nil {
						fail("Complete with a token never issued succeeded")
					}
				}
				continue
			}
			resp := Response{Status: 200 + rng.IntN(100), Body: []byte(fmt.Sprint("body-", step))}
			if rng.IntN(3) == 0 {
				resp.Header = map[string][]string{"X-Step": {strconv.Itoa(step)}, "X-Nil": nil}
			}
			for _, s := range []*MemoryStore{viaBegin, viaResult} {
				if err := s.Complete(ctx, key, r.token, resp, now, retention); err != nil {
					fail("Complete: %v", err)
				}
			}
			r.done, r.leaseUntil, r.expiresAt, r.resp = true, 0, n+int64(retention), resp
		case op < 8:
			r := m.live(key, n)
			if r == nil || r.done {
				continue
			}
			for _, s := range []*MemoryStore{viaBegin, viaResult} {
				if err := s.Extend(ctx, key, r.token, now, lease); err != nil {
					fail("Extend: %v", err)
				}
			}
			r.leaseUntil = n + int64(lease)
			r.expiresAt = max(r.expiresAt, r.leaseUntil)
		case op < 9:
			r := m.live(key, n)
			if r == nil || r.done {
				continue
			}
			for _, s := range []*MemoryStore{viaBegin, viaResult} {
				if err := s.Release(ctx, key, r.token); err != nil {
					fail("Release: %v", err)
				}
			}
			delete(m.recs, key)
		default:
			if rng.IntN(2) == 0 {
				for _, s := range []*MemoryStore{viaBegin, viaResult} {
					if err := s.Delete(ctx, key); err != nil {
						fail("Delete: %v", err)
					}
				}
				delete(m.recs, key)
				continue
			}
			r := m.live(key, n)
			for _, s := range []*MemoryStore{viaBegin, viaResult} {
				got, err := s.Get(ctx, key, now)
				if (err == nil) != (r != nil) {
					fail("Get: %v, model has it: %v", err, r != nil)
				}
				if r != nil && (got.Token != r.token || got.ExpiresAt.UnixNano() != r.expiresAt) {
					fail("Get = %+v, model %+v", got, r)
				}
			}
		}
		if step%500 == 0 {
			checkShards(t, viaBegin)
			checkShards(t, viaResult)
		}
	}
	checkShards(t, viaBegin)
	checkShards(t, viaResult)
}
