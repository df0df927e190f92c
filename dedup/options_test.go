package dedup_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

// TestWindowShorterThanLeaseNamesDedupOptions: the error names the options
// the user set (Window, Lease) and the defaults they fell back to, not the
// Guard's Retention, which dedup's user never sees.
func TestWindowShorterThanLeaseNamesDedupOptions(t *testing.T) {
	s := idempotency.NewMemoryStore()
	for _, tc := range []struct {
		name string
		opts dedup.Options
		want []string
	}{
		{"default-lease", dedup.Options{Window: time.Second}, []string{"Window 1s", "Lease 30s (default)"}},
		{"both-set", dedup.Options{Window: time.Second, Lease: time.Minute}, []string{"Window 1s", "Lease 1m0s"}},
		{"default-window", dedup.Options{Lease: 48 * time.Hour}, []string{"Window 24h0m0s (default)", "Lease 48h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dedup.New(s, &tc.opts)
			if !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("New = %q, want it to say %q", msg, w)
				}
			}
			if strings.Contains(msg, "Retention") {
				t.Errorf("New = %q, names Retention, which is not a dedup option", msg)
			}
		})
	}
	if _, err := dedup.New(s, &dedup.Options{Window: time.Minute, Lease: time.Minute}); err != nil {
		t.Errorf("Window equal to Lease: %v, want a Window", err)
	}
}
