package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/base64"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// NewKey returns a fresh key: 128 bits from crypto/rand, base64url without
// padding (22 characters).
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

type keyCtx struct{}

// WithKey returns a context whose guarded calls carry key. A caller that
// retries a call by itself makes this context once and passes it to every
// attempt, so that every attempt names the same operation.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFromContext returns the key set by WithKey or EnsureKey.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok && k != ""
}

// EnsureKey returns ctx and its key if it has one, else a context with a
// fresh key: the helper a retry loop calls once before its first attempt.
//
//	ctx, _ = idemgrpc.EnsureKey(ctx)
//	for range 3 {
//		if _, err = client.Pay(ctx, req); status.Code(err) != codes.Unavailable {
//			break
//		}
//	}
func EnsureKey(ctx context.Context) (context.Context, string) {
	if k, ok := KeyFromContext(ctx); ok {
		return ctx, k
	}
	k := NewKey()
	return WithKey(ctx, k), k
}

// ClientOptions configure UnaryClientInterceptor; nil means all defaults.
type ClientOptions struct {
	// Methods reports whether calls to a full method name get a key. nil:
	// every unary method (a server that does not guard a method ignores
	// the field).
	Methods func(fullMethod string) bool
}

// UnaryClientInterceptor returns an interceptor that sends an
// idempotency-key with every guarded call: the one already in the outgoing
// metadata if any, else the context's (WithKey, EnsureKey), else a fresh one
// for this call alone. gRPC's retry policy resends the metadata of the
// logical call, so its retries carry the same key. Chain it before
// (outside) any retrying client interceptor, which would otherwise call it
// once per attempt, each time with a fresh key.
func UnaryClientInterceptor(opts *ClientOptions) grpc.UnaryClientInterceptor {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if o.Methods != nil && !o.Methods(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(MetadataKey)) > 0 {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		key, ok := KeyFromContext(ctx)
		if !ok {
			key = NewKey()
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}
