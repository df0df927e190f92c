// Command nats consumes a NATS JetStream stream through natsdedup: an order
// that the stream holds twice (its producer retried after JetStream's own
// duplicate window had passed) is charged once, and the copy is acked unrun.
//
//	go run ./examples/nats -nats nats://127.0.0.1:4222
//
// It makes a stream of its own (a memory stream with a random name) and
// deletes it before it returns.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "nats:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("nats", "nats://127.0.0.1:4222", "NATS server with JetStream")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()

	nc, err := nats.Connect(*url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// A stream whose publish-side duplicate window (Nats-Msg-Id) is short,
	// so that the producer's late retry below is stored a second time.
	name := "EXAMPLE_ORDERS_" + randomSuffix()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".created"},
		Storage: jetstream.MemoryStorage, Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)
	// natsdedup needs AckExplicit, and a Window lease no longer than AckWait
	// (both default to 30s).
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		return err
	}

	// The dedup window. One process here; a fleet of consumers shares a
	// redisstore or pgstore instead.
	window, err := dedup.New(idempotency.NewMemoryStore(), nil)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	charges := map[string]int{}
	charge := func(ctx context.Context, msg jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		charges[string(msg.Data())]++
		return nil // an error Naks the message, and its redelivery runs again
	}
	answered := make(chan struct{}, 16)
	handler, err := natsdedup.New(window, charge, &natsdedup.Options{
		Consumer: cons,
		OnDecision: func(msg jetstream.Msg, d dedup.Decision, err error) {
			fmt.Fprintf(stdout, "%s: %s %s", msg.Headers().Get(jetstream.MsgIDHeader), d.Action, d.Outcome)
			if err != nil {
				fmt.Fprintf(stdout, " (%v)", err)
			}
			fmt.Fprintln(stdout)
			answered <- struct{}{}
		},
	})
	if err != nil {
		return err
	}

	// order-1 is published twice, the second time after the stream's
	// duplicate window: JetStream stores both copies.
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if _, err := js.Publish(ctx, name+".created", []byte(id), jetstream.WithMsgID(id)); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}

	cc, err := cons.Consume(handler.MessageHandler(ctx))
	if err != nil {
		return err
	}
	for range 3 {
		select {
		case <-answered:
		case <-ctx.Done():
			cc.Stop()
			return fmt.Errorf("waiting for the messages: %w", ctx.Err())
		}
	}
	// Drain answers what was pulled; wait for it before closing the
	// connection, or those answers are lost.
	cc.Drain()
	<-cc.Closed()

	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(stdout, "charges: %v\n", charges)
	if charges["order-1"] != 1 || charges["order-2"] != 1 {
		return errors.New("an order was not charged exactly once")
	}
	fmt.Fprintln(stdout, "each order was charged exactly once")
	return nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ToUpper(hex.EncodeToString(b[:]))
}
