package idemgrpc_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemgrpc"
	"google.golang.org/grpc"
)

func Example() {
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		panic(err)
	}
	// Keys are required, so name the guarded methods: with Methods nil every
	// unary method would need one, health checks included.
	in, err := idemgrpc.UnaryServerInterceptor(guard, &idemgrpc.Options{
		Methods: func(fullMethod string) bool {
			return strings.HasPrefix(fullMethod, "/shop.v1.Orders/")
		},
		Required: true,
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(in))
	defer srv.Stop()
	// Register services on srv and Serve.

	// Client side: grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)),
	// and one key per logical call, kept across the caller's own retries.
	ctx, key := idemgrpc.EnsureKey(context.Background())
	again, same := idemgrpc.EnsureKey(ctx)
	fmt.Println(len(key), same == key, again == ctx)
	// Output: 22 true true
}
