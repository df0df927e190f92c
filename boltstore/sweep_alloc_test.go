package boltstore

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// Sweeping a record needs its expiry only: the sweep (and Delete) must not
// copy the bodies of the records they remove. A window of large responses
// otherwise costs every write a copy of each body it sweeps.
func TestSweepDoesNotCopyBodies(t *testing.T) {
	s := openTest(t, &Options{SweepPerWrite: -1, SweepBatch: 100})
	const n, size = 16, 1 << 20
	body := make([]byte, size)
	for i := range n {
		key := fmt.Sprint("big", i)
		rec, _, err := s.Begin(ctx, key, "fp", t0, lease, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 201, Body: body}, t0, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := s.Sweep(ctx, t0.Add(time.Hour), 0)
	runtime.ReadMemStats(&after)
	if err != nil || got != n {
		t.Fatalf("Sweep = %d, %v; want %d", got, err, n)
	}
	// Copying the bodies would allocate n MiB; the sweep's own work is a
	// few kilobytes (keys, the transaction's pages).
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size {
		t.Errorf("Sweep of %d records with %d-byte bodies allocated %d bytes; want under %d (the bodies copied?)", n, size, alloc, size)
	}
	if r, x := counts(t, s); r != 0 || x != 0 {
		t.Errorf("after sweeping: %d records, %d index entries; want none", r, x)
	}
}

// expiryOf must agree with decode on every record decode accepts.
func TestExpiryOfAgreesWithDecode(t *testing.T) {
	for i, r := range codecSamples() {
		at, err := expiryOf(encode(nil, &r))
		if err != nil || at != r.expiresAt {
			t.Errorf("sample %d: expiryOf = %d, %v; want %d", i, at, err, r.expiresAt)
		}
	}
	for name, b := range map[string][]byte{
		"empty":         {},
		"version":       {9, stateDone, 1, 0, 0},
		"state":         {codecV1, 7, 1, 0, 0},
		"truncated":     {codecV1, stateDone, 1, 0},
		"bad varint":    {codecV1, stateDone, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"no expiry yet": {codecV1, stateProcessing},
	} {
		if at, err := expiryOf(b); err == nil {
			t.Errorf("%s: expiryOf(%x) = %d, nil; want an error", name, b, at)
		}
	}
}
