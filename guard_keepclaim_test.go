package idempotency

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/archlab/idempotency/internal/keepclaim"
)

// TestKeepClaimOnAbnormalEnd: fn that set its claim's keepclaim.Flag and
// then ends without returning (runtime.Goexit, an unrecovered panic) leaves
// its claim in place until the lease ends (a retry meanwhile is in
// flight), on the MemoryStore's fast path and on the Store interface's;
// without the flag the key is released (TestGoexitReleases).
func TestKeepClaimOnAbnormalEnd(t *testing.T) {
	ends := map[string]func(){
		"Goexit": runtime.Goexit,
		"panic":  func() { panic("idempotency test: a deliberate panic") },
	}
	for _, fast := range []bool{true, false} {
		for name, end := range ends {
			for _, set := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/fast=%v/set=%v", name, fast, set), func(t *testing.T) {
					ms := NewMemoryStore()
					var s Store = ms
					if !fast {
						s = hidden{ms}
					}
					g := &Guard{Store: s, Lease: time.Minute, Retention: time.Hour}
					ctx := context.Background()
					done := make(chan struct{})
					go func() {
						defer close(done)
						defer func() { _ = recover() }()
						_, _ = g.Run(ctx, "k", "fp", func(ctx context.Context) (Response, error) {
							f := keepclaim.From(ctx)
							if f == nil {
								t.Error("fn's context has no keepclaim.Flag")
								return Response{}, nil
							}
							if set {
								f.Set()
							}
							end()
							return Response{}, nil
						})
						t.Error("Run returned")
					}()
					<-done
					ran := false
					r, err := g.Run(ctx, "k", "fp", func(context.Context) (Response, error) {
						ran = true
						return Response{Status: 201}, nil
					})
					if set {
						if !errors.Is(err, ErrInFlight) || ran {
							t.Fatalf("retry after the flagged end: %s %v (ran %v); want %s, the claim kept", r.Outcome, err, ran, InFlight)
						}
					} else if err != nil || r.Outcome != Executed {
						t.Fatalf("retry after the end: %s %v; want %s, the key released", r.Outcome, err, Executed)
					}
				})
			}
		}
	}
}

// A context that does not come from a Guard has no Flag.
func TestKeepClaimFromOtherContext(t *testing.T) {
	if f := keepclaim.From(context.Background()); f != nil {
		t.Fatalf("keepclaim.From(Background) = %v, want nil", f)
	}
}
