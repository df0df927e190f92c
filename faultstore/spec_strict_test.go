package faultstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
)

// TestParseStrict: specs that cannot mean what they say are refused, with
// an error that wraps idempotency.ErrInvalidConfig and names the problem.
func TestParseStrict(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string // in the error
	}{
		// An operation listed twice is a typo for another one.
		{"begin|begin:error", `operation "begin" listed twice`},
		{"complete|get|complete:lostack", `operation "complete" listed twice`},
		// error and hang never call what follows them in a chain.
		{"begin:error+latency=5ms", `"latency=5ms" after "error" is never reached`},
		{"begin:hang+lostack", `"lostack" after "hang" is never reached`},
		{"*:latency=1ms+error+error:0.5", `"error" after "error" is never reached`},
		// Durations: a negative one, a range with a bound missing, and
		// more than two bounds are named as such.
		{"begin:latency=-1ms", "negative"},
		{"begin:latency=1ms-", "upper bound"},
		{"begin:latency=-", "lower bound"},
		{"begin:latency=1ms-2ms-3ms", "MIN-MAX"},
		{"begin:latency=", "duration"},
		// Everything else Parse refuses wraps the sentinel too.
		{"frobnicate:error", `unknown operation "frobnicate"`},
		{"begin:explode", `unknown fault "explode"`},
		{"begin:error:2", "probability"},
		{"begin", "ops:faults"},
		// A rule never reached, for an operation it lists, because an
		// earlier rule gives that operation a fault every time: a typo,
		// or a misreading of "the first rule that hits".
		{"begin:error,begin:lostack", `operation "begin" never reaches this rule: rule 1 gives it a fault every time`},
		{"*:error,get:hang", `operation "get" never reaches this rule: rule 1`},
		{"begin|get:lostack,extend:error,get|delete:latency=1ms", `operation "get" never reaches this rule: rule 1`},
		{"begin|complete|extend:error,release|get|delete:lostack,*:hang", "every operation gets a fault from an earlier rule"},
	} {
		spec, err := faultstore.Parse(tc.spec)
		if err == nil {
			t.Errorf("Parse(%q) = %q; want an error", tc.spec, spec)
			continue
		}
		if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v; want an error wrapping ErrInvalidConfig that says %q", tc.spec, err, tc.want)
		}
	}
	// Faults that do call what follows them chain as before.
	// So do rules after one that does not hit every time, and a catch-all
	// rule that still reaches some operation.
	for _, ok := range []string{"begin:lostack+lostack", "begin:latency=1ms+error", "begin:lostack+hang", "begin:latency=1ms+latency=2ms",
		"begin:error:0.5,begin:lostack", "begin:error:0,begin:lostack", "begin:error,*:latency=1ms", "*:error:0.1,*:lostack"} {
		if _, err := faultstore.Parse(ok); err != nil {
			t.Errorf("Parse(%q): %v", ok, err)
		}
	}
	// A negative zero probability is zero in the canonical form.
	if spec, err := faultstore.Parse("get:hang:-0"); err != nil || spec.String() != "get:hang:0" {
		t.Errorf("Parse(%q) = %v, %v; want get:hang:0", "get:hang:-0", spec, err)
	}
}
