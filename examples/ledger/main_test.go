package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunChargesOnce(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"EXECUTED: 201",
		"REPLAYED: 201",
		"CONFLICT: idempotency key reused with different parameters",
		"handler calls=2 stock=8",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
