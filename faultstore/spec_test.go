package faultstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, canonical string
	}{
		{"", ""},
		{"begin:lostack:0.1,complete:error:1", "begin:lostack:0.1,complete:error"},
		{" * : latency=1ms-20ms : 0.5 ", "*:latency=1ms-20ms:0.5"},
		{"begin|extend:latency=5ms+lostack", "begin|extend:latency=5ms+lostack"},
		{"get:hang:0", "get:hang:0"},
		{"delete:latency=1s-1s", "delete:latency=1s"},
	} {
		spec, err := faultstore.Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if got := spec.String(); got != tc.canonical {
			t.Errorf("Parse(%q).String() = %q; want %q", tc.in, got, tc.canonical)
		}
	}
	for _, bad := range []string{"begin", "begin:", "frobnicate:error", "begin:explode", "begin:error:1.5",
		"begin:error:-0.1", "begin:error:NaN", "begin:latency=", "begin:latency=5ms-1ms", "begin:latency=-1ms",
		"begin:error:0.5:1", ",", "begin|:error"} {
		if spec, err := faultstore.Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %q; want an error", bad, spec)
		}
	}
}

func TestSpecInjector(t *testing.T) {
	spec, err := faultstore.Parse("begin:lostack,complete:error:0.5,*:latency=1ms")
	if err != nil {
		t.Fatal(err)
	}
	inj := spec.Injector(9)
	if f := inj.MaybeFault(faultstore.OpBegin, "k"); f == nil || f.String() != "lostack" {
		t.Errorf("begin fault = %v; want lostack", f)
	}
	if f := inj.MaybeFault(faultstore.OpGet, "k"); f == nil || f.String() != "latency=1ms" {
		t.Errorf("get fault = %v; want latency=1ms", f)
	}
	counts := map[string]int{}
	for range 400 {
		if f := inj.MaybeFault(faultstore.OpComplete, "k"); f != nil {
			counts[f.String()]++
		}
	}
	// complete: error half of the time, else the catch-all latency.
	if counts["error"] < 140 || counts["error"] > 260 || counts["error"]+counts["latency=1ms"] != 400 {
		t.Errorf("complete faults over 400 calls = %v; want about 200 error, the rest latency", counts)
	}
	// The same seed gives the same choices, another seed others.
	kinds := func(inj faultstore.Injector) string {
		var s []byte
		for range 100 {
			s = append(s, inj.MaybeFault(faultstore.OpComplete, "k").String()[0])
		}
		return string(s)
	}
	if k1, k2, k3 := kinds(spec.Injector(9)), kinds(spec.Injector(9)), kinds(spec.Injector(10)); k1 != k2 || k1 == k3 {
		t.Errorf("seeded spec injectors: seed 9 gave %s and %s, seed 10 gave %s", k1, k2, k3)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "begin:lostack:0.1,complete:error:1", "*:latency=1ms-20ms:0.5",
		"begin|extend:latency=5ms+lostack", "get:hang:0", "begin:error:1e-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := faultstore.Parse(s)
		if err != nil {
			return
		}
		canon := spec.String()
		again, err := faultstore.Parse(canon)
		if err != nil {
			t.Fatalf("Parse(%q) gave %q, which does not parse: %v", s, canon, err)
		}
		if again.String() != canon {
			t.Fatalf("canonical form not stable: %q -> %q -> %q", s, canon, again.String())
		}
		// The documented promise is an equal Spec, not just an equal text.
		if !reflect.DeepEqual(again, spec) {
			t.Fatalf("Parse(%q) = %+v, but Parse of its String %q = %+v", s, spec, canon, again)
		}
		for _, r := range spec.Rules {
			if r.P < 0 || r.P > 1 || len(r.Faults) == 0 {
				t.Fatalf("Parse(%q) accepted rule %+v", s, r)
			}
			for _, fs := range r.Faults {
				if fs.Min < 0 || fs.Max < fs.Min || (fs.Kind != "latency" && (fs.Min != 0 || fs.Max != 0)) {
					t.Fatalf("Parse(%q) accepted fault %+v", s, fs)
				}
				if fs.Max > time.Hour {
					return // do not build injectors that would sleep for ages
				}
			}
		}
		inj := spec.Injector(1)
		for _, op := range faultstore.Ops {
			if f := inj.MaybeFault(op, "k"); f != nil && f.String() == "" {
				t.Fatalf("Parse(%q): fault with an empty name for %s", s, op)
			}
		}
	})
}

// TestSpecConcurrentUse shares one spec injector, latency draws included,
// among goroutines (-race checks its state): every call gets the fault of
// its rule or none, and the store counts every fault given.
func TestSpecConcurrentUse(t *testing.T) {
	spec, err := faultstore.Parse("begin:latency=0s-200us+lostack:0.5,get:error:0.5,*:latency=0s-100us")
	if err != nil {
		t.Fatal(err)
	}
	s := faultstore.New(idempotency.NewMemoryStore(), spec.Injector(3))
	var wg sync.WaitGroup
	var lost, failed atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				key := fmt.Sprintf("k%d-%d", g, i)
				_, _, err := s.Begin(context.Background(), key, "fp", t0, time.Second, time.Hour)
				var ie *faultstore.InjectedError
				switch {
				case err == nil:
				case errors.As(err, &ie) && ie.Fault == "lostack" && ie.Applied:
					lost.Add(1)
				default:
					t.Errorf("Begin(%s) = %v; want nil or an applied lost ack", key, err)
				}
				if _, err := s.Get(context.Background(), key, t0); err != nil {
					if !errors.As(err, &ie) || ie.Fault != "error" {
						t.Errorf("Get(%s) = %v; want a record or an injected error", key, err)
					}
					failed.Add(1)
				}
				_ = s.Delete(context.Background(), key)
			}
		})
	}
	wg.Wait()
	if lost.Load() == 0 || failed.Load() == 0 {
		t.Errorf("lost acks %d, failed gets %d of 200 each at p=0.5; want some of both", lost.Load(), failed.Load())
	}
	// Every call got a fault: Begin its rule's or the catch-all latency,
	// Get an error or the latency, Delete the latency.
	if got, want := s.InjectedTotal(), 3*200; got != want {
		t.Errorf("InjectedTotal = %d; want %d", got, want)
	}
}
