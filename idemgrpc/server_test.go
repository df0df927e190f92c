package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
)

func TestReplayReturnsStoredResponseAndHeader(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := testCtx(t)
	first, h1, err := f.echo(ctx, "k-replay", "order-1")
	if err != nil {
		t.Fatal(err)
	}
	if got := h1.Get(idemgrpc.ReplayedKey); len(got) != 0 {
		t.Errorf("first call has %s %v, want none", idemgrpc.ReplayedKey, got)
	}
	for i := range 3 {
		again, h2, err := f.echo(ctx, "k-replay", "order-1")
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		if !proto.Equal(first, again) {
			t.Errorf("retry %d: response %v, want the stored %v", i, again, first)
		}
		if got, want := h2.Get("x-execution"), h1.Get("x-execution"); len(want) != 1 || len(got) != 1 || got[0] != want[0] {
			t.Errorf("retry %d: x-execution header %v, want the stored %v", i, got, want)
		}
		if got := h2.Get(idemgrpc.ReplayedKey); len(got) != 1 || got[0] != "true" {
			t.Errorf("retry %d: %s = %v, want [true]", i, idemgrpc.ReplayedKey, got)
		}
	}
	if n := f.svc.executions("order-1"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	// Another key is another operation.
	if _, _, err := f.echo(ctx, "k-replay-2", "order-1"); err != nil {
		t.Fatal(err)
	}
	if n := f.svc.executions("order-1"); n != 2 {
		t.Errorf("handler ran %d times after a second key, want 2", n)
	}
}

func TestReplayStructResponse(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := metadata.AppendToOutgoingContext(testCtx(t), idemgrpc.MetadataKey, "k-put")
	in, _ := structpb.NewStruct(map[string]any{"amount": 42, "currency": "EUR", "tags": []any{"a", "b"}})
	var outs [2]*structpb.Struct
	for i := range outs {
		outs[i] = new(structpb.Struct)
		if err := f.conn.Invoke(ctx, putMethod, in, outs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !proto.Equal(outs[0], outs[1]) {
		t.Errorf("replayed %v, want %v", outs[1], outs[0])
	}
	if n := f.svc.executions("put"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		time.Sleep(20 * time.Millisecond) // widen the window for duplicates
		return wrapperspb.String(fmt.Sprintf("%s#%d", in.GetValue(), n)), nil
	}
	ctx := testCtx(t)
	const callers = 16
	var wg sync.WaitGroup
	results := make([]*wrapperspb.StringValue, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			results[i], _, errs[i] = f.echo(ctx, "k-concurrent", "pay")
		})
	}
	close(start)
	wg.Wait()
	if n := f.svc.executions("pay"); n != 1 {
		t.Fatalf("handler ran %d times for %d concurrent duplicates, want 1", n, callers)
	}
	ok := 0
	for i := range callers {
		switch status.Code(errs[i]) {
		case codes.OK:
			ok++
			if results[i].GetValue() != "pay#1" {
				t.Errorf("caller %d got %q, want the one execution's pay#1", i, results[i].GetValue())
			}
		case codes.Aborted:
		default:
			t.Errorf("caller %d: %v, want OK or Aborted", i, errs[i])
		}
	}
	if ok == 0 {
		t.Error("no caller got the response")
	}
}

func TestInFlightIsAbortedWithRetryInfo(t *testing.T) {
	f := newFixture(t, fixtureOpts{guard: &idempotency.Options{Lease: 10 * time.Second}})
	entered := make(chan struct{})
	finish := make(chan struct{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		close(entered)
		<-finish
		return wrapperspb.String("done"), nil
	}
	ctx := testCtx(t)
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := f.echo(ctx, "k-inflight", "slow")
		firstErr <- err
	}()
	<-entered
	_, _, err := f.echo(ctx, "k-inflight", "slow")
	st := status.Convert(err)
	if st.Code() != codes.Aborted {
		t.Fatalf("duplicate while in flight: %v, want Aborted", err)
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil {
		t.Fatalf("Aborted without RetryInfo: details %v", st.Details())
	}
	if d := info.GetRetryDelay().AsDuration(); d <= 0 || d > 10*time.Second {
		t.Errorf("RetryInfo delay %v, want within the 10s lease", d)
	}
	close(finish)
	if err := <-firstErr; err != nil {
		t.Fatalf("first call: %v", err)
	}
	out, _, err := f.echo(ctx, "k-inflight", "slow")
	if err != nil || out.GetValue() != "done" {
		t.Fatalf("after completion: %v, %v; want the stored response", out, err)
	}
	if n := f.svc.executions("slow"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestConflictIsFailedPrecondition(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := testCtx(t)
	if _, _, err := f.echo(ctx, "k-conflict", "first"); err != nil {
		t.Fatal(err)
	}
	_, _, err := f.echo(ctx, "k-conflict", "second")
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("same key, other payload: %v, want FailedPrecondition", err)
	}
	found := false
	for _, d := range st.Details() {
		if pf, ok := d.(*errdetails.PreconditionFailure); ok && len(pf.GetViolations()) == 1 && pf.GetViolations()[0].GetSubject() == "k-conflict" {
			found = true
		}
	}
	if !found {
		t.Errorf("no PreconditionFailure naming the key in %v", st.Details())
	}
	// Same key on another method is another request too.
	pctx := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "k-conflict")
	in, _ := structpb.NewStruct(map[string]any{"value": "first"})
	if err := f.conn.Invoke(pctx, putMethod, in, new(structpb.Struct)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("same key, other method: %v, want FailedPrecondition", err)
	}
	if n := f.svc.executions("second") + f.svc.executions("put"); n != 0 {
		t.Errorf("conflicting calls ran the handler %d times", n)
	}
}

func TestStoreUnavailable(t *testing.T) {
	var broken sync.Map // op -> bool
	var reported atomic.Value
	f := newFixture(t, fixtureOpts{
		server: &idemgrpc.Options{OnStoreError: func(_ context.Context, method string, err error) {
			reported.Store(method + ": " + err.Error())
		}},
		setupStore: func(s *idempotency.MemoryStore) {
			s.Fault = func(op string) error {
				if _, ok := broken.Load(op); ok {
					return errors.New("injected outage at redis-7.internal:6379")
				}
				return nil
			}
		}})
	ctx := testCtx(t)
	broken.Store("begin", true)
	_, _, err := f.echo(ctx, "k-down", "v")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("store down: %v, want Unavailable", err)
	}
	// The store's error goes to the operator's hook, not to the client.
	if strings.Contains(err.Error(), "redis-7.internal") {
		t.Errorf("the client was told the store's error: %v", err)
	}
	if r, _ := reported.Load().(string); !strings.Contains(r, "redis-7.internal") || !strings.Contains(r, "/") {
		t.Errorf("OnStoreError got %q, want the method and the store's error", r)
	}
	if n := f.svc.executions("v"); n != 0 {
		t.Fatalf("handler ran %d times with the store down, want 0 (fail closed)", n)
	}
	broken.Delete("begin")
	// The store fails after the handler ran: the response is still sent.
	broken.Store("complete", true)
	out, _, err := f.echo(ctx, "k-down", "v")
	if err != nil || out.GetValue() == "" {
		t.Fatalf("complete failing: %v, %v; want the handler's response", out, err)
	}
	if n := f.svc.executions("v"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestRequiredKey(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Required: true}})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name, key string
	}{
		{"missing", ""},
		{"space", "a b"},
		{"too-long", strings.Repeat("k", 300)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.key == "" {
				_, _, err = f.echo(ctx, "", "v")
			} else {
				mctx := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, tc.key)
				err = f.conn.Invoke(mctx, echoMethod, wrapperspb.String("v"), new(wrapperspb.StringValue))
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%v, want InvalidArgument", err)
			}
		})
	}
	if n := f.svc.executions("v"); n != 0 {
		t.Errorf("handler ran %d times without a valid key", n)
	}
}

func TestOptionalKeyRunsUnguarded(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := testCtx(t)
	for range 2 {
		if _, _, err := f.echo(ctx, "", "free"); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.executions("free"); n != 2 {
		t.Errorf("keyless calls ran %d times, want 2 (unguarded)", n)
	}
}

func TestKeyFuncRequestID(t *testing.T) {
	// AIP-155 style: the key is a field of the request. Here the Struct's
	// "request_id".
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Required: true, KeyFunc: func(_ context.Context, req any) string {
		if s, ok := req.(*structpb.Struct); ok {
			return s.GetFields()["request_id"].GetStringValue()
		}
		return ""
	}}})
	putTwiceRunsOnce(t, f)
}

func TestHandlerErrors(t *testing.T) {
	tests := []struct {
		name        string
		code        codes.Code
		storeErrors bool
		// wantSecond is the code of the retry with the same key;
		// wantRuns the executions after both calls.
		wantSecond codes.Code
		wantRuns   int
	}{
		{"unavailable-releases", codes.Unavailable, false, codes.OK, 2},
		{"resource-exhausted-releases", codes.ResourceExhausted, false, codes.OK, 2},
		{"not-found-keeps-claim", codes.NotFound, false, codes.Aborted, 1},
		{"internal-keeps-claim", codes.Internal, false, codes.Aborted, 1},
		{"not-found-stored", codes.NotFound, true, codes.NotFound, 1},
		{"unavailable-released-even-when-storing", codes.Unavailable, true, codes.OK, 2},
		// These describe the call (the client left, its deadline passed),
		// not the operation: never stored, the claim is kept.
		{"canceled-never-stored", codes.Canceled, true, codes.Aborted, 1},
		{"deadline-exceeded-never-stored", codes.DeadlineExceeded, true, codes.Aborted, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: tc.storeErrors}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					st, _ := status.New(tc.code, "first attempt fails").WithDetails(&errdetails.ErrorInfo{Reason: "TEST"})
					return nil, st.Err()
				}
				return wrapperspb.String("ok"), nil
			}
			ctx := testCtx(t)
			_, _, err := f.echo(ctx, "k-err", "v")
			if status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v", err, tc.code)
			}
			_, _, err = f.echo(ctx, "k-err", "v")
			st := status.Convert(err)
			if st.Code() != tc.wantSecond {
				t.Fatalf("retry: %v, want %v", err, tc.wantSecond)
			}
			if tc.storeErrors && tc.wantSecond == tc.code {
				if st.Message() != "first attempt fails" || len(st.Details()) != 1 {
					t.Errorf("replayed status %q %v, want the stored message and details", st.Message(), st.Details())
				}
			}
			if n := f.svc.executions("v"); n != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

func TestLeaseLostSendsResponseWithoutStoring(t *testing.T) {
	var f *fixture
	f = newFixture(t, fixtureOpts{})
	f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
		if n == 1 {
			// An operator deletes the key while the handler runs: the claim
			// is gone, so the result cannot be stored.
			if err := f.store.Delete(ctx, "k-lost"); err != nil {
				return nil, err
			}
		}
		return wrapperspb.String(fmt.Sprintf("run-%d", n)), nil
	}
	ctx := testCtx(t)
	out, _, err := f.echo(ctx, "k-lost", "v")
	if err != nil || out.GetValue() != "run-1" {
		t.Fatalf("first call: %v, %v; want the handler's run-1", out, err)
	}
	out, _, err = f.echo(ctx, "k-lost", "v")
	if err != nil || out.GetValue() != "run-2" {
		t.Fatalf("retry: %v, %v; want a new execution (nothing was stored)", out, err)
	}
}

func TestScopeSeparatesCallers(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Scope: func(ctx context.Context) string {
		return metadata.ValueFromIncomingContext(ctx, "x-tenant")[0]
	}}})
	ctx := testCtx(t)
	for _, tenant := range []string{"a", "b", "a"} {
		tctx := metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant)
		if _, _, err := f.echo(tctx, "same-key", "v-"+tenant); err != nil {
			t.Fatalf("tenant %s: %v", tenant, err)
		}
	}
	if a, b := f.svc.executions("v-a"), f.svc.executions("v-b"); a != 1 || b != 1 {
		t.Errorf("executions a=%d b=%d, want 1 each", a, b)
	}
}

func TestMethodsFilter(t *testing.T) {
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{Methods: func(m string) bool { return m == putMethod }}})
	ctx := testCtx(t)
	for range 2 {
		if _, _, err := f.echo(ctx, "k-filter", "unguarded"); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.executions("unguarded"); n != 2 {
		t.Errorf("unguarded method ran %d times, want 2", n)
	}
}

func TestInterceptorOptionsValidated(t *testing.T) {
	if _, err := idemgrpc.UnaryServerInterceptor(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("nil guard: %v, want ErrInvalidConfig", err)
	}
	if _, err := idemgrpc.UnaryServerInterceptor(&idempotency.Guard{}, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("guard without store: %v, want ErrInvalidConfig", err)
	}
	g, _ := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	for _, c := range []codes.Code{17, 31, 99} { // gRPC defines 0 to 16
		if _, err := idemgrpc.UnaryServerInterceptor(g, &idemgrpc.Options{ReleaseCodes: []codes.Code{c}}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("release code %d: %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := idemgrpc.UnaryServerInterceptor(g, &idemgrpc.Options{ReleaseCodes: []codes.Code{codes.Unauthenticated}}); err != nil {
		t.Errorf("release code Unauthenticated: %v", err)
	}
}

func TestNewResponseOption(t *testing.T) {
	var asked []string
	f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{NewResponse: func(m string) proto.Message {
		asked = append(asked, m) // replays run one at a time here
		return new(wrapperspb.StringValue)
	}}})
	ctx := testCtx(t)
	first, _, err := f.echo(ctx, "k-new", "v")
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := f.echo(ctx, "k-new", "v")
	if err != nil || !proto.Equal(first, again) {
		t.Fatalf("replay: %v, %v; want %v", again, err, first)
	}
	if len(asked) != 1 || asked[0] != echoMethod {
		t.Errorf("NewResponse called for %q, want once for %s", asked, echoMethod)
	}
}

func TestReplayOfUnknownTypeFailsInternal(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := testCtx(t)
	// Rewrite the record as if its response type were one this binary does
	// not know (written by another service version).
	if _, _, err := f.echo(ctx, "k-type", "v"); err != nil {
		t.Fatal(err)
	}
	rec, err := f.store.Get(ctx, "k-type", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Delete(ctx, "k-type"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r, _, err := f.store.Begin(ctx, "k-type", rec.Fingerprint, now, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	resp := rec.Response
	resp.Header[":type"] = []string{"no.such.Type"}
	if err := f.store.Complete(ctx, "k-type", r.Token, resp, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.echo(ctx, "k-type", "v"); status.Code(err) != codes.Internal {
		t.Errorf("replay of an unknown type: %v, want Internal", err)
	}
}

// TestRawContextErrorsNeverStored: a handler that returns its context's
// error as it is (return nil, ctx.Err(), or wrapped with %w) is answered
// Canceled or DeadlineExceeded by gRPC, and must be treated so here too:
// not stored as Unknown and replayed to every retry, but kept as a claim.
func TestRawContextErrorsNeverStored(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"canceled", context.Canceled, codes.Canceled},
		{"deadline-exceeded-wrapped", fmt.Errorf("db: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{server: &idemgrpc.Options{StoreErrors: true}})
			f.svc.onEcho = func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error) {
				if n == 1 {
					return nil, tc.err
				}
				return wrapperspb.String("ok"), nil
			}
			ctx := testCtx(t)
			if _, _, err := f.echo(ctx, "k-ctx", "v"); status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v", err, tc.code)
			}
			if _, _, err := f.echo(ctx, "k-ctx", "v"); status.Code(err) != codes.Aborted {
				t.Fatalf("retry: %v, want Aborted (the claim is kept, nothing stored)", err)
			}
			if n := f.svc.executions("v"); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// putTwiceRunsOnce calls Put twice with one request_id and wants one
// execution and equal replies.
func putTwiceRunsOnce(t *testing.T, f *fixture) {
	t.Helper()
	ctx := testCtx(t)
	in, _ := structpb.NewStruct(map[string]any{"request_id": "0f1e2d3c", "amount": 7})
	var outs [2]*structpb.Struct
	for i := range outs {
		outs[i] = new(structpb.Struct)
		if err := f.conn.Invoke(ctx, putMethod, in, outs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.executions("put"); n != 1 || !proto.Equal(outs[0], outs[1]) {
		t.Errorf("same request_id ran %d times, replies %v / %v; want 1 and equal", n, outs[0], outs[1])
	}
}
