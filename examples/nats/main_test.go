package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/archlab/idempotency/internal/testenv"
)

func TestRunChargesOncePerMessageID(t *testing.T) {
	url := testenv.NATSURL(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-nats", url}, &out, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := "order-1: ACK EXECUTED\norder-2: ACK EXECUTED\norder-1: ACK REPLAYED\ncharges: map[order-1:1 order-2:1]\n"
	if !strings.HasPrefix(out.String(), want) {
		t.Errorf("output:\n%s\nwant it to start with:\n%s", out.String(), want)
	}
}

func TestRunFailsWithoutServer(t *testing.T) {
	// A port nothing listens on: run must report the failed connection, not hang.
	if err := run(context.Background(), []string{"-nats", "nats://127.0.0.1:1"}, io.Discard, io.Discard); err == nil {
		t.Fatal("run succeeded without a NATS server")
	}
}
