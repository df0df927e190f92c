package main

import (
	"io"
	"testing"
)

// -visualize reaches the store certification; without it, and in the
// other modes, no directory is given.
func TestVisualizeFlag(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-store", "memory", "-visualize", dir}, dir},
		{[]string{"-store", "memory"}, ""},
		{nil, ""},
	} {
		cfg, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("parse(%q): %v", tc.args, err)
		}
		if cfg.visualize != tc.want {
			t.Errorf("parse(%q): visualize %q, want %q", tc.args, cfg.visualize, tc.want)
		}
	}
}

// -concurrency's defaults: 8 clients in the demo, blackbox's own (0 here)
// with -target, and a value given is kept.
func TestConcurrencyDefaults(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 8},
		{[]string{"-store", "memory"}, 8},
		{[]string{"-target", "http://127.0.0.1:1/"}, 0},
		{[]string{"-target", "http://127.0.0.1:1/", "-concurrency", "4"}, 4},
		{[]string{"-concurrency", "3"}, 3},
	} {
		cfg, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("parse(%q): %v", tc.args, err)
		}
		if cfg.concurrency != tc.want {
			t.Errorf("parse(%q): concurrency %d, want %d", tc.args, cfg.concurrency, tc.want)
		}
	}
}
