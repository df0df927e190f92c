package idemgrpc_test

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		k := idemgrpc.NewKey()
		b, err := base64.RawURLEncoding.DecodeString(k)
		if err != nil || len(b) != 16 {
			t.Fatalf("key %q: %d bytes, %v; want 16 base64url bytes", k, len(b), err)
		}
		if seen[k] {
			t.Fatalf("key %q repeated", k)
		}
		seen[k] = true
	}
}

func TestClientAttachesFreshKeyPerCall(t *testing.T) {
	f := newFixture(t, fixtureOpts{dialOpts: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil))}})
	ctx := testCtx(t)
	for range 2 {
		if _, _, err := f.echo(ctx, "", "v"); err != nil {
			t.Fatal(err)
		}
	}
	keys := f.seenKeys()
	if len(keys) != 2 || keys[0] == keys[1] || len(keys[0]) != 22 {
		t.Fatalf("keys seen %q, want two distinct 22-character keys", keys)
	}
	if n := f.svc.executions("v"); n != 2 {
		t.Errorf("two logical calls ran %d times, want 2", n)
	}
}

func TestClientKeepsKeyAcrossCallerRetries(t *testing.T) {
	f := newFixture(t, fixtureOpts{dialOpts: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil))}})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("charged"), nil
	}
	ctx, key := idemgrpc.EnsureKey(testCtx(t))
	if ctx2, key2 := idemgrpc.EnsureKey(ctx); key2 != key || ctx2 != ctx {
		t.Fatalf("EnsureKey on a keyed context made a new key %q (had %q)", key2, key)
	}
	// A caller's retry loop: the response of the first attempt is "lost",
	// so it calls again with the same context.
	for attempt := range 3 {
		out, _, err := f.echo(ctx, "", "pay")
		if err != nil || out.GetValue() != "charged" {
			t.Fatalf("attempt %d: %v, %v", attempt, out, err)
		}
	}
	keys := f.seenKeys()
	for i, k := range keys {
		if k != key {
			t.Errorf("attempt %d sent key %q, want %q", i, k, key)
		}
	}
	if len(keys) != 3 {
		t.Errorf("server saw %d attempts, want 3", len(keys))
	}
	if n := f.svc.executions("pay"); n != 1 {
		t.Errorf("handler ran %d times for one logical call, want 1", n)
	}
}

func TestClientKeepsExplicitMetadata(t *testing.T) {
	f := newFixture(t, fixtureOpts{dialOpts: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil))}})
	ctx := idemgrpc.WithKey(testCtx(t), "from-context")
	if _, _, err := f.echo(ctx, "explicit", "v"); err != nil {
		t.Fatal(err)
	}
	if keys := f.seenKeys(); len(keys) != 1 || keys[0] != "explicit" {
		t.Errorf("keys seen %q, want exactly [explicit]", keys)
	}
}

func TestClientMethodsFilter(t *testing.T) {
	in := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientOptions{Methods: func(m string) bool { return m == putMethod }})
	f := newFixture(t, fixtureOpts{dialOpts: []grpc.DialOption{grpc.WithUnaryInterceptor(in)}})
	if _, _, err := f.echo(testCtx(t), "", "v"); err != nil {
		t.Fatal(err)
	}
	if keys := f.seenKeys(); len(keys) != 0 {
		t.Errorf("unguarded method got keys %q", keys)
	}
}

// gRPC's retry policy runs below the interceptors: each attempt resends the
// logical call's metadata, so the key is the same. The handler refuses the
// first attempt with Unavailable, which releases the key, and the policy's
// retry then runs it.
func TestClientKeyUnderGRPCRetryPolicy(t *testing.T) {
	const serviceConfig = `{"methodConfig": [{
		"name": [{"service": "idemtest.Echo"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}
	}]}`
	f := newFixture(t, fixtureOpts{dialOpts: []grpc.DialOption{
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)),
		grpc.WithDefaultServiceConfig(serviceConfig),
	}})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if n == 1 {
			return nil, status.Error(codes.Unavailable, "warming up")
		}
		return wrapperspb.String("ok"), nil
	}
	out, _, err := f.echo(testCtx(t), "", "v")
	if err != nil || out.GetValue() != "ok" {
		t.Fatalf("call: %v, %v; want ok after a policy retry", out, err)
	}
	keys := f.seenKeys()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("attempts carried keys %q, want the same key twice", keys)
	}
	if n := f.svc.executions("v"); n != 2 {
		t.Errorf("handler ran %d times, want 2 (refused, then run)", n)
	}
	// A new logical call gets a new key.
	if _, _, err := f.echo(testCtx(t), "", "v"); err != nil {
		t.Fatal(err)
	}
	if keys := f.seenKeys(); len(keys) != 3 || keys[2] == keys[0] {
		t.Errorf("second logical call reused key: %q", keys)
	}
}
