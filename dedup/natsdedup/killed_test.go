package natsdedup_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
	"github.com/archlab/idempotency/dedup/natsdedup"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/redisstore"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// childCommand re-executes the test binary as a consumer process.
const childCommand = "natsdedup-test-consumer"

const childLease = 500 * time.Millisecond

// effectFn is a consumer's fn: the message's effect is a count in Redis,
// which every process sees.
func effectFn(client *redis.Client, effects string) func(context.Context, jetstream.Msg) error {
	return func(ctx context.Context, msg jetstream.Msg) error {
		return client.HIncrBy(context.WithoutCancel(ctx), effects, string(msg.Data()), 1).Err()
	}
}

// holdAck is a delivery whose Ack never goes out: the process freezes
// there, its result stored, until it is killed.
type holdAck struct{ jetstream.Msg }

func (holdAck) Ack() error {
	fmt.Println("HOLD")
	select {}
}

// runChild consumes as one process of a fleet sharing a durable consumer
// and a Redis window: args are the NATS URL, stream, durable, Redis URL,
// key prefix, the message to hold and where ("fn": before its effect;
// "ack": after its result was stored, before the ack). It prints HOLD
// when it holds the message, and runs until it is killed.
func runChild(args []string) error {
	if len(args) != 7 {
		return fmt.Errorf("want 7 arguments, got %q", args)
	}
	natsURL, streamName, durable, redisURL, prefix, holdID, where := args[0], args[1], args[2], args[3], args[4], args[5], args[6]
	go func() {
		// The test holds stdin open: if it dies without killing this
		// process, this process does not outlive it.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(2)
	}()
	ctx := context.Background()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, streamName, durable)
	if err != nil {
		return err
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	client := redis.NewClient(opt)
	store, err := redisstore.New(client, &redisstore.Options{Prefix: prefix + "w:"})
	if err != nil {
		return err
	}
	w, err := dedup.New(store, &dedup.Options{Lease: childLease})
	if err != nil {
		return err
	}
	effect := effectFn(client, prefix+"effects")
	h, err := natsdedup.New(w, func(ctx context.Context, msg jetstream.Msg) error {
		if where == "fn" && string(msg.Data()) == holdID {
			fmt.Println("HOLD") // claimed, effect not done yet
			select {}
		}
		return effect(ctx, msg)
	}, &natsdedup.Options{Consumer: cons})
	if err != nil {
		return err
	}
	if _, err := cons.Consume(func(msg jetstream.Msg) {
		if where == "ack" && string(msg.Data()) == holdID {
			msg = holdAck{msg}
		}
		_, _ = h.Handle(ctx, msg)
	}, jetstream.PullMaxMessages(4)); err != nil {
		return err
	}
	select {}
}

// TestConsumerProcessKilled: a consumer process is killed (SIGKILL) while
// it holds a message, either inside fn before the effect (its claim stays
// until its lease ends) or after the result was stored but before the ack
// went out; the messages it had pulled but not handled die with it. A new
// consumer process takes over the durable: every message's effect must
// have happened exactly once, and nothing may stay pending.
func TestConsumerProcessKilled(t *testing.T) {
	for _, where := range []string{"fn", "ack"} {
		t.Run(where, func(t *testing.T) {
			const (
				n       = 20
				ackWait = time.Second
			)
			js, name, subject := stream(t, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			id := func(i int) string { return fmt.Sprintf("order-%02d", i) }
			for i := range n {
				if _, err := js.Publish(ctx, subject, []byte(id(i)), jetstream.WithMsgID(id(i))); err != nil {
					t.Fatal(err)
				}
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
				Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
			})
			if err != nil {
				t.Fatal(err)
			}
			redisURL := testenv.RedisURL(t)
			opt, err := redis.ParseURL(redisURL)
			if err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(opt)
			t.Cleanup(func() { _ = client.Close() })
			prefix := testenv.Unique("idemtest:natsdedup:") + ":"
			t.Cleanup(func() {
				keys, _ := client.Keys(context.Background(), prefix+"*").Result()
				if len(keys) > 0 {
					client.Del(context.Background(), keys...)
				}
			})

			holdID := id(n / 2)
			child := exec.CommandContext(ctx, os.Args[0], childCommand,
				testenv.NATSURL(t), name, "workers", redisURL, prefix, holdID, where)
			child.Stderr = os.Stderr
			stdin, err := child.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = stdin.Close() })
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			t.Cleanup(func() {
				if !killed {
					_ = child.Process.Kill()
					_ = child.Wait()
				}
			})
			held := make(chan bool, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if strings.TrimSpace(sc.Text()) == "HOLD" {
						held <- true
						break
					}
				}
				close(held)
				_, _ = bufio.NewReader(out).WriteTo(io.Discard)
			}()
			select {
			case ok := <-held:
				if !ok {
					t.Fatal("the consumer process ended without holding a message")
				}
			case <-ctx.Done():
				t.Fatal("the consumer process did not hold a message")
			}
			_ = child.Process.Kill()
			_ = child.Wait()
			killed = true

			store, err := redisstore.New(client, &redisstore.Options{Prefix: prefix + "w:"})
			if err != nil {
				t.Fatal(err)
			}
			w, err := dedup.New(store, &dedup.Options{Lease: childLease})
			if err != nil {
				t.Fatal(err)
			}
			var rec decisions
			h, err := natsdedup.New(w, effectFn(client, prefix+"effects"), &natsdedup.Options{Consumer: cons, OnDecision: rec.add})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := cons.Consume(h.MessageHandler(ctx))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { cc.Stop(); <-cc.Closed() }()
			waitDrainedCtx(t, ctx, cons)
			cc.Stop()
			<-cc.Closed()

			effects, err := client.HGetAll(ctx, prefix+"effects").Result()
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if effects[id(i)] != "1" {
					t.Errorf("%s: effect count %q, want 1", id(i), effects[id(i)])
				}
			}
			if len(effects) != n {
				t.Errorf("effects for %d ids, want %d", len(effects), n)
			}
			// The held message comes to the new consumer: processed there
			// if the killed one died before its effect, replayed if after
			// its result was stored.
			want := map[string]idempotency.Outcome{"fn": idempotency.Executed, "ack": idempotency.Replayed}[where]
			var heldOutcomes []idempotency.Outcome
			for _, a := range rec.list() {
				if a.err != nil {
					t.Errorf("new consumer: %s: %+v, %v", a.data, a.d, a.err)
				}
				if a.data == holdID {
					heldOutcomes = append(heldOutcomes, a.d.Outcome)
				}
			}
			if len(heldOutcomes) == 0 || heldOutcomes[len(heldOutcomes)-1] != want {
				t.Errorf("held message %s answered %v by the new consumer, want %s last", holdID, heldOutcomes, want)
			}
		})
	}
}
