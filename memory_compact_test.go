package idempotency

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestMemoryCompacts: once a burst has expired and been swept, each shard's
// record slice and index are rebuilt to the live records' size, and every live
// record is still found under its key with its own contents.
func TestMemoryCompacts(t *testing.T) {
	s := NewMemoryStore()
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	const burst = 16 * memShards * compactMin
	for i := range burst {
		if _, _, err := s.Begin(ctx, fmt.Sprintf("burst-%d", i), "fp", t0, time.Second, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	peak := 0
	for i := range s.shards {
		peak += len(s.shards[i].recs)
	}
	later := t0.Add(2 * time.Minute)
	const live = 3000
	for i := range live {
		key := fmt.Sprintf("live-%d", i)
		rec, ok, err := s.Begin(ctx, key, "fp-"+key, later, time.Second, time.Hour)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Complete(ctx, key, rec.Token, Response{Status: 201, Body: []byte(key)}, later, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// Sweeping is incremental: keep writing (to the live keys, which
	// replays) until the burst is gone.
	for round := 0; s.Len() > live && round < 100; round++ {
		for i := range live {
			key := fmt.Sprintf("live-%d", i)
			if _, _, err := s.Begin(ctx, key, "fp-"+key, later, time.Second, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, "absent", 1); err == nil {
				t.Fatal("Release of an absent key succeeded")
			}
		}
		// Replays do not sweep; claims of fresh keys do.
		for i := range 1000 {
			key := fmt.Sprintf("sweeper-%d-%d", round, i)
			rec, _, err := s.Begin(ctx, key, "fp", later, time.Second, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, key, rec.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.Len(); got != live {
		t.Fatalf("Len = %d after the burst expired, want %d", got, live)
	}
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		total += len(sh.recs)
		indexed := 0
		for _, v := range sh.slots {
			if v != 0 && uint32(v) != slotDeleted {
				indexed++
			}
		}
		if indexed != len(sh.recs)-len(sh.free) {
			t.Errorf("shard %d: %d keys in the index, %d positions used", i, indexed, len(sh.recs)-len(sh.free))
		}
		if len(sh.slots) > 4*len(sh.recs)+minSlots {
			t.Errorf("shard %d: %d index slots for %d record positions: the index was not rebuilt", i, len(sh.slots), len(sh.recs))
		}
	}
	// A shard is left alone while it has fewer than compactMin free
	// positions; past that, it holds about its live records.
	if bound := live + memShards*compactMin; total > bound {
		t.Errorf("record slices hold %d positions for %d live records (peak %d, bound %d): not compacted", total, live, peak, bound)
	}
	for i := range live {
		key := fmt.Sprintf("live-%d", i)
		rec, err := s.Get(ctx, key, later)
		if err != nil {
			t.Fatalf("Get(%s): %v", key, err)
		}
		if rec.Fingerprint != "fp-"+key || string(rec.Response.Body) != key || rec.State != Done {
			t.Fatalf("Get(%s) = %+v after compaction", key, rec)
		}
	}
	t.Logf("record positions: %d at the peak, %d for %d live records", peak, total, live)
}

// TestShardIndexChurn drives one shard's index against a Go map, with
// hashes chosen to collide (a handful of distinct values, so probes run
// through long chains of equal tags and deleted slots), through adds,
// removes, reindexing and compaction.
func TestShardIndexChurn(t *testing.T) {
	sh := &memShard{}
	model := map[string]uint64{}
	hashOf := func(i int) uint64 { return uint64(i%5) * 0x9e3779b97f4a7c15 }
	rng := uint64(1)
	next := func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	for step := range 200_000 {
		i := next(3000)
		key := fmt.Sprintf("k%d", i)
		h := hashOf(i)
		rec := sh.get(h, key)
		_, inModel := model[key]
		if (rec != nil) != inModel {
			t.Fatalf("step %d: get(%s) found %v, model has it: %v", step, key, rec != nil, inModel)
		}
		if rec != nil {
			if rec.key != key || rec.token != model[key] {
				t.Fatalf("step %d: get(%s) returned the record of %s (token %d, want %d)", step, key, rec.key, rec.token, model[key])
			}
			sh.remove(rec)
			delete(model, key)
			continue
		}
		tok := uint64(step + 1)
		sh.add(h, key, memRecord{state: memProcessing, token: tok})
		model[key] = tok
	}
	for key, tok := range model {
		var i int
		fmt.Sscanf(key, "k%d", &i)
		if rec := sh.get(hashOf(i), key); rec == nil || rec.token != tok {
			t.Fatalf("end: %s lost", key)
		}
	}
	if live := len(sh.recs) - len(sh.free); live != len(model) {
		t.Fatalf("%d live positions, model has %d", live, len(model))
	}
	if sh.used*4 > len(sh.slots)*3 {
		t.Fatalf("index over three quarters full: %d of %d slots", sh.used, len(sh.slots))
	}
}
