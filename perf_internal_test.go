package idempotency

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func queueLen(s *MemoryStore) int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].exp)
		s.shards[i].mu.Unlock()
	}
	return n
}

// TestMemoryQueueOneEntryPerRecord: claims, completions, renewals and
// takeovers add no queue entries, so the queue holds about one entry per
// record; released and re-created keys leave stale entries that are dropped.
func TestMemoryQueueOneEntryPerRecord(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	base := time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)
	const n = 200
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		rec, ok, err := s.Begin(ctx, key, "fp", base, time.Second, time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Extend(ctx, key, rec.Token, base.Add(time.Millisecond), time.Second); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 200}, base.Add(time.Second), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if got := queueLen(s); got != n {
		t.Errorf("queue holds %d entries for %d records, want one each", got, n)
	}
	// The completed records expire a second after their claims' entries:
	// the sweep requeues them and reclaims them at their own time.
	mid := base.Add(time.Minute + time.Second/2)
	for i := range n {
		if _, _, err := s.Begin(ctx, fmt.Sprintf("x%d", i), "fp", mid, time.Second, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if live := s.Keys(mid); len(live) != 2*n {
		t.Fatalf("%d live records at %v, want %d (completions kept every record past its claim's expiry)", len(live), mid, 2*n)
	}
	if s.Len() != 2*n {
		t.Errorf("Len = %d, want %d: a record was reclaimed before its expiry", s.Len(), 2*n)
	}
	late := base.Add(time.Minute + 2*time.Second)
	for i := range 2 * n {
		if _, _, err := s.Begin(ctx, fmt.Sprintf("y%d", i), "fp", late, time.Second, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := s.Len(), 3*n; got != want {
		t.Errorf("Len = %d after the first records' expiry, want %d (they are reclaimed)", got, want)
	}

	// One key claimed and released many times: stale entries are dropped
	// as they come due, and never requeued.
	r := NewMemoryStore()
	for i := range 1000 {
		now := base.Add(time.Duration(i) * time.Millisecond)
		rec, ok, err := r.Begin(ctx, "k", "fp", now, time.Second, 10*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("claim %d: %v, %v", i, ok, err)
		}
		if err := r.Release(ctx, "k", rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	if got := queueLen(r); got > 20 {
		t.Errorf("queue holds %d entries for one key claimed and released in turn, want about its window (10)", got)
	}
}

// TestMemoryCompleteShorterRetention: a result stored with a retention
// shorter than the claim's is reclaimed at its own, earlier, expiry.
func TestMemoryCompleteShorterRetention(t *testing.T) {
	// A full store reclaims expired records from every shard before it
	// refuses a claim: the second claim succeeds only if the first record
	// is queued at its one-minute expiry.
	s, err := NewMemoryStoreWith(&MemoryOptions{MaxRecords: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)
	rec, _, err := s.Begin(ctx, "short", "fp", base, time.Second, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "short", rec.Token, Response{Status: 200}, base, time.Minute); err != nil {
		t.Fatal(err)
	}
	later := base.Add(2 * time.Minute)
	if _, _, err := s.Begin(ctx, "other", "fp", later, time.Second, time.Hour); err != nil {
		t.Fatalf("claim in a full store two minutes later: %v", err)
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d, want 1: the result with a one-minute retention is still held after two minutes", s.Len())
	}
}

// TestMemoryBodiesIsolated: bodies held in a shared slab are the store's
// own: neither the caller's input nor a replayed copy reaches them, and
// records in one slab do not see each other's bytes.
func TestMemoryBodiesIsolated(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	now := time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)
	bodies := map[string][]byte{"nil": nil, "empty": {}, "small": []byte("abc"),
		"edge": make([]byte, slabMax), "large": make([]byte, slabMax+1)}
	for i := range 100 { // enough to fill several slabs of every shard
		bodies[fmt.Sprintf("b%d", i)] = []byte(fmt.Sprintf("body %d", i))
	}
	want := map[string][]byte{}
	for key, body := range bodies {
		want[key] = slices.Clone(body)
		rec, _, err := s.Begin(ctx, key, "fp", now, time.Second, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 200, Body: body}, now, time.Hour); err != nil {
			t.Fatal(err)
		}
		if len(body) > 0 {
			body[0] ^= 0xff // the caller reuses its buffer
		}
	}
	for key, w := range want {
		rec, _, err := s.Begin(ctx, key, "fp", now, time.Second, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		got := rec.Response.Body
		if (got == nil) != (w == nil) || string(got) != string(w) {
			t.Fatalf("replay of %s = %q (nil %v), want %q (nil %v)", key, got, got == nil, w, w == nil)
		}
		if len(got) > 0 {
			got[0] ^= 0xff
		}
		_ = append(got, "overwrite?"...) // must not reach a neighbour
	}
	for key, w := range want {
		rec, err := s.Get(ctx, key, now)
		if err != nil {
			t.Fatal(err)
		}
		if string(rec.Response.Body) != string(w) {
			t.Errorf("%s after callers edited replays = %q, want %q", key, rec.Response.Body, w)
		}
	}
}

// TestHeaderEncoding: a header goes through the store's encoding whole
// (nil and empty value slices told apart, long names and values, many
// fields), comes back as the caller's own, and a decoded copy's value
// slices do not share memory with each other.
func TestHeaderEncoding(t *testing.T) {
	var sh memShard
	if sh.keepHeader(nil) != nil || decodeHeader(nil) != nil {
		t.Error("a nil header does not stay nil")
	}
	if got := decodeHeader(sh.keepHeader(map[string][]string{})); got == nil || len(got) != 0 {
		t.Errorf("an empty header came back as %#v", got)
	}
	long := strings.Repeat("v", 300)
	h := map[string][]string{"A": {"1", "2"}, "B": {"3"}, "Nil": nil, "Empty": {}, "Long-" + long: {long, ""}}
	for i := range 20 {
		h["X-Field-"+strconv.Itoa(i)] = []string{strconv.Itoa(i)}
	}
	for _, small := range []bool{true, false} {
		in := h
		if small {
			in = map[string][]string{"A": {"1", "2"}, "Nil": nil, "Empty": {}}
		}
		enc := sh.keepHeader(in)
		if small != (len(enc) <= slabMax) {
			t.Fatalf("small=%v: encoding of %d bytes", small, len(enc))
		}
		c := decodeHeader(enc)
		if len(c) != len(in) {
			t.Fatalf("decoded %d fields, want %d", len(c), len(in))
		}
		for k, v := range in {
			if (c[k] == nil) != (v == nil) || !slices.Equal(c[k], v) {
				t.Errorf("decoded[%.20s] = %#v, want %#v", k, c[k], v)
			}
		}
		c["A"] = append(c["A"][:1], "x") // within A's capacity only
		if got := decodeHeader(enc)["A"]; !slices.Equal(got, []string{"1", "2"}) {
			t.Errorf("editing a decoded copy changed the stored header: A = %v", got)
		}
		if !small && !slices.Equal(c["B"], []string{"3"}) {
			t.Errorf("appending to one value overwrote another: B = %v", c["B"])
		}
	}
}
