package idemgrpc_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service is declared by hand from well-known types, so no protoc
// is needed:
//
//	service Echo {
//	  rpc Echo(google.protobuf.StringValue) returns (google.protobuf.StringValue);
//	  rpc Put(google.protobuf.Struct) returns (google.protobuf.Struct);
//	}
const (
	echoMethod = "/idemtest.Echo/Echo"
	putMethod  = "/idemtest.Echo/Put"
)

type echoService interface {
	echo(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
	put(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error)
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Echo",
	HandlerType: (*echoService)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(wrapperspb.StringValue)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(echoService).echo(ctx, req.(*wrapperspb.StringValue))
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: echoMethod}, h)
		}},
		{MethodName: "Put", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(echoService).put(ctx, req.(*structpb.Struct))
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: putMethod}, h)
		}},
	},
}

// service counts executions and lets a test decide what each returns.
type service struct {
	mu    sync.Mutex
	calls map[string]int // by request value
	keys  []string       // idempotency keys seen by the handler, in order
	// onEcho, when set, answers Echo after the call was counted.
	onEcho func(ctx context.Context, in *wrapperspb.StringValue, n int) (*wrapperspb.StringValue, error)
}

func newService() *service { return &service{calls: map[string]int{}} }

func (s *service) count(ctx context.Context, what string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[what]++
	s.keys = append(s.keys, metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey)...)
	return s.calls[what]
}

func (s *service) executions(what string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[what]
}

func (s *service) echo(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	n := s.count(ctx, in.GetValue())
	if s.onEcho != nil {
		return s.onEcho(ctx, in, n)
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-execution", time.Now().Format(time.RFC3339Nano))); err != nil {
		return nil, err
	}
	return wrapperspb.String(in.GetValue() + "@" + time.Now().Format(time.RFC3339Nano)), nil
}

func (s *service) put(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	s.count(ctx, "put")
	out, _ := structpb.NewStruct(map[string]any{"stored": true, "at": time.Now().Format(time.RFC3339Nano)})
	for k, v := range in.GetFields() {
		out.Fields["in_"+k] = v
	}
	return out, nil
}

type fixture struct {
	svc   *service
	store *idempotency.MemoryStore
	guard *idempotency.Guard
	conn  *grpc.ClientConn
	addr  string // the server's address, to dial more connections
	// seen records the idempotency-key metadata of every call reaching the
	// server, before the guard (so also calls the guard answers itself).
	seenMu sync.Mutex
	seen   []string
}

func (f *fixture) seenKeys() []string {
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	return append([]string(nil), f.seen...)
}

type fixtureOpts struct {
	server     *idemgrpc.Options
	guard      *idempotency.Options
	dialOpts   []grpc.DialOption
	serverOpts []grpc.ServerOption
	unguarded  bool
	setupStore func(*idempotency.MemoryStore)
	// store, when set, is the guard's store instead of the fixture's
	// MemoryStore.
	store idempotency.Store
	// outer and inner, when set, are chained before and after the guard.
	outer, inner grpc.UnaryServerInterceptor
}

// newFixture serves the test service on 127.0.0.1 with the guard, and dials
// it.
func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	f := &fixture{svc: newService(), store: idempotency.NewMemoryStore()}
	if o.setupStore != nil {
		o.setupStore(f.store)
	}
	var store idempotency.Store = f.store
	if o.store != nil {
		store = o.store
	}
	g, err := idempotency.NewGuard(store, o.guard)
	if err != nil {
		t.Fatal(err)
	}
	f.guard = g
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		f.seenMu.Lock()
		f.seen = append(f.seen, metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey)...)
		f.seenMu.Unlock()
		return h(ctx, req)
	}
	var chain []grpc.UnaryServerInterceptor
	if o.outer != nil {
		chain = append(chain, o.outer)
	}
	chain = append(chain, record)
	if !o.unguarded {
		in, err := idemgrpc.UnaryServerInterceptor(g, o.server)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, in)
	}
	if o.inner != nil {
		chain = append(chain, o.inner)
	}
	srv := grpc.NewServer(append(o.serverOpts, grpc.ChainUnaryInterceptor(chain...))...)
	srv.RegisterService(&echoDesc, f.svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	f.addr = lis.Addr().String()
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.dialOpts...)
	conn, err := grpc.NewClient(lis.Addr().String(), dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	f.conn = conn
	return f
}

func (f *fixture) echo(ctx context.Context, key, value string, opts ...grpc.CallOption) (*wrapperspb.StringValue, metadata.MD, error) {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	var header metadata.MD
	out := new(wrapperspb.StringValue)
	err := f.conn.Invoke(ctx, echoMethod, wrapperspb.String(value), out, append(opts, grpc.Header(&header))...)
	return out, header, err
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
