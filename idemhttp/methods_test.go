package idemhttp

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
)

// TestNewRefusesMethodsThatGuardNothing: HTTP methods are case-sensitive
// (RFC 9110, section 9.1) and r.Method is passed on as the client sent it,
// so Methods {"post"} would guard no POST at all, and an empty, non-nil
// Methods would guard nothing either. Both are refused, naming the value;
// a custom method, of any case, is still accepted.
func TestNewRefusesMethodsThatGuardNothing(t *testing.T) {
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		methods []string
		want    string
	}{
		{"lower-case-post", []string{"post"}, `"post"`},
		{"mixed-case-patch", []string{http.MethodPost, "Patch"}, `"Patch"`},
		{"lower-case-delete", []string{"delete"}, "DELETE"},
		{"empty", []string{}, "Methods is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(g, &Options{Methods: tc.methods})
			if !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("New(Methods %q) = %v, want ErrInvalidConfig", tc.methods, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(Methods %q) = %q, want it to say %s", tc.methods, err, tc.want)
			}
		})
	}
	for _, ok := range [][]string{{http.MethodPut}, {"PURGE"}, {"purge"}, {http.MethodPost, http.MethodDelete}} {
		if _, err := New(g, &Options{Methods: ok}); err != nil {
			t.Errorf("New(Methods %q) = %v, want a Middleware", ok, err)
		}
	}
}
