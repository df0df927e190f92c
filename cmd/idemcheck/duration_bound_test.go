package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDurationBound: -duration accepts its bound and refuses anything
// longer, and the help states the bound as one that is included.
func TestDurationBound(t *testing.T) {
	cfg, err := parse([]string{"-duration", maxDuration.String()}, io.Discard)
	if err != nil {
		t.Fatalf("-duration %v refused: %v", maxDuration, err)
	}
	if cfg.duration != maxDuration {
		t.Errorf("-duration %v parsed as %v", maxDuration, cfg.duration)
	}
	over := (maxDuration + time.Millisecond).String()
	var uerr usageError
	if _, err := parse([]string{"-duration", over}, io.Discard); !errors.As(err, &uerr) || !strings.Contains(err.Error(), "-duration") {
		t.Errorf("-duration %s: error %v, want a usage error naming -duration", over, err)
	}
	var help strings.Builder
	if _, err := parse([]string{"-h"}, &help); err == nil {
		t.Fatal("-h parsed without flag.ErrHelp")
	}
	want := "at most " + maxDuration.String()
	i := strings.Index(help.String(), "  -duration")
	if i < 0 {
		t.Fatalf("help lists no -duration:\n%s", help.String())
	}
	line, _, _ := strings.Cut(help.String()[i:], "\n  -")
	if !strings.Contains(line, want) || strings.Contains(line, "under") {
		t.Errorf("-duration help %q: want the included bound %q", line, want)
	}
}
