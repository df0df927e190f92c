package faultstore

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/archlab/idempotency"
)

// Spec is a parsed fault specification, a compact way to describe an
// Injector as text, in a flag or a test table (no command of this module
// takes one today). Its syntax:
//
//	spec   = "" | rule { "," rule }
//	rule   = ops ":" faults [ ":" prob ]
//	ops    = "*" | op { "|" op }          op: begin complete extend release get delete
//	faults = fault { "+" fault }          chained in order (see Chain)
//	fault  = "error" | "lostack" | "hang" | "latency=" dur [ "-" dur ]
//	prob   = a number in [0, 1]; 1 when left out
//
// For example "begin:lostack:0.1,complete:error:1,*:latency=1ms-20ms:0.5".
// For each operation the first rule whose ops match and whose random draw
// hits gives the fault. Parse refuses what could never run: an operation
// listed twice in a rule; a fault after "error" or "hang" in a chain (they
// never perform the operation); an operation listed in a rule after one
// whose probability is 1 already gives it a fault every time; and a "*"
// rule after such rules for every operation. A "*" rule after some of them
// reads as "every other operation".
type Spec struct {
	Rules []Rule
}

// Rule is one rule of a Spec.
type Rule struct {
	Ops    []Op // nil: every operation
	Faults []FaultSpec
	P      float64
}

// FaultSpec is one fault of a Rule. Min and Max are set for "latency".
type FaultSpec struct {
	Kind     string // "error", "lostack", "hang" or "latency"
	Min, Max time.Duration
}

// Parse parses a fault specification. A spec it refuses gives an error
// that wraps idempotency.ErrInvalidConfig and names the rule at fault.
func Parse(s string) (*Spec, error) {
	spec := &Spec{}
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	// always holds, per operation, the number of the first rule that gives
	// it a fault every time (0: none does).
	var always [len(Ops)]int
	for i, text := range strings.Split(s, ",") {
		r, err := parseRule(strings.TrimSpace(text))
		if err == nil {
			err = reached(r, &always, i+1)
		}
		if err != nil {
			return nil, fmt.Errorf("faultstore: %w: rule %d %q: %w", idempotency.ErrInvalidConfig, i+1, text, err)
		}
		spec.Rules = append(spec.Rules, r)
	}
	return spec, nil
}

// reached checks that rule n, r, can give a fault to every operation it
// lists (or, for "*", to some operation), given the rules before it, and
// then notes the operations r gives a fault every time.
func reached(r Rule, always *[len(Ops)]int, n int) error {
	ops := r.Ops
	if ops == nil {
		ops = Ops[:]
		shadowed := true
		for _, op := range ops {
			shadowed = shadowed && always[op.index()] != 0
		}
		if shadowed {
			return fmt.Errorf("every operation gets a fault from an earlier rule every time; this rule is never reached")
		}
	} else {
		for _, op := range ops {
			if by := always[op.index()]; by != 0 {
				return fmt.Errorf("operation %q never reaches this rule: rule %d gives it a fault every time", op, by)
			}
		}
	}
	if r.P == 1 {
		for _, op := range ops {
			if always[op.index()] == 0 {
				always[op.index()] = n
			}
		}
	}
	return nil
}

func parseRule(s string) (Rule, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return Rule{}, fmt.Errorf("want ops:faults[:prob]")
	}
	r := Rule{P: 1}
	ops := strings.TrimSpace(parts[0])
	if ops != "*" {
		for _, name := range strings.Split(ops, "|") {
			op := Op(strings.TrimSpace(name))
			if op.index() < 0 {
				return Rule{}, fmt.Errorf("unknown operation %q", name)
			}
			if slices.Contains(r.Ops, op) {
				return Rule{}, fmt.Errorf("operation %q listed twice", op)
			}
			r.Ops = append(r.Ops, op)
		}
	}
	for _, text := range strings.Split(parts[1], "+") {
		f, err := parseFault(strings.TrimSpace(text))
		if err != nil {
			return Rule{}, err
		}
		if n := len(r.Faults); n > 0 && (r.Faults[n-1].Kind == "error" || r.Faults[n-1].Kind == "hang") {
			return Rule{}, fmt.Errorf("fault %q after %q is never reached: %s never performs the operation", f, r.Faults[n-1], r.Faults[n-1])
		}
		r.Faults = append(r.Faults, f)
	}
	if len(parts) == 3 {
		p, err := strconv.ParseFloat(strings.TrimSpace(parts[2]), 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 1 {
			return Rule{}, fmt.Errorf("probability %q is not a number in [0, 1]", parts[2])
		}
		r.P = math.Abs(p) // "-0" is 0
	}
	return r, nil
}

func parseFault(s string) (FaultSpec, error) {
	switch s {
	case "error", "lostack", "hang":
		return FaultSpec{Kind: s}, nil
	}
	arg, ok := strings.CutPrefix(s, "latency=")
	if !ok {
		return FaultSpec{}, fmt.Errorf("unknown fault %q", s)
	}
	// '-' separates the bounds, so a negative duration shows as an empty
	// lower bound.
	bounds := strings.Split(arg, "-")
	switch {
	case len(bounds) > 2:
		return FaultSpec{}, fmt.Errorf("latency %q: want latency=DURATION or latency=MIN-MAX", arg)
	case len(bounds) == 2 && strings.TrimSpace(bounds[0]) == "" && strings.TrimSpace(bounds[1]) != "":
		return FaultSpec{}, fmt.Errorf("latency %q: a duration must not be negative", arg)
	case len(bounds) == 2 && strings.TrimSpace(bounds[0]) == "":
		return FaultSpec{}, fmt.Errorf("latency range %q: the lower bound is missing", arg)
	case len(bounds) == 2 && strings.TrimSpace(bounds[1]) == "":
		return FaultSpec{}, fmt.Errorf("latency range %q: the upper bound is missing", arg)
	}
	low, err := parseDuration(bounds[0])
	if err != nil {
		return FaultSpec{}, err
	}
	high := low
	if len(bounds) == 2 {
		if high, err = parseDuration(bounds[1]); err != nil {
			return FaultSpec{}, err
		}
	}
	if high < low {
		return FaultSpec{}, fmt.Errorf("latency range %q is empty", arg)
	}
	return FaultSpec{Kind: "latency", Min: low, Max: high}, nil
}

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("latency: a duration is missing")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("latency: %w", err)
	}
	if d < 0 {
		return 0, fmt.Errorf("latency %v is negative", d)
	}
	return d, nil
}

// String returns the spec in canonical form; Parse(s.String()) gives an
// equal Spec.
func (s *Spec) String() string {
	rules := make([]string, len(s.Rules))
	for i, r := range s.Rules {
		rules[i] = r.String()
	}
	return strings.Join(rules, ",")
}

// String returns the rule in canonical form.
func (r Rule) String() string {
	var b strings.Builder
	if r.Ops == nil {
		b.WriteString("*")
	}
	for i, op := range r.Ops {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(string(op))
	}
	b.WriteByte(':')
	for i, f := range r.Faults {
		if i > 0 {
			b.WriteByte('+')
		}
		b.WriteString(f.String())
	}
	if r.P != 1 {
		b.WriteByte(':')
		b.WriteString(strconv.FormatFloat(r.P, 'g', -1, 64))
	}
	return b.String()
}

// String returns the fault in the syntax of Parse.
func (f FaultSpec) String() string {
	if f.Kind != "latency" {
		return f.Kind
	}
	if f.Min == f.Max {
		return "latency=" + f.Min.String()
	}
	return "latency=" + f.Min.String() + "-" + f.Max.String()
}

// Injector builds the spec's injector. seed drives every random choice and
// latency draw, so the same seed and the same sequence of calls give the
// same faults.
func (s *Spec) Injector(seed uint64) Injector {
	injs := make([]Injector, 0, len(s.Rules))
	for i, r := range s.Rules {
		ruleSeed := seed + uint64(i)*0x9e3779b97f4a7c15
		faults := make([]Fault, len(r.Faults))
		for j, f := range r.Faults {
			switch f.Kind {
			case "error":
				faults[j] = Error(nil)
			case "lostack":
				faults[j] = LostAck(nil)
			case "hang":
				faults[j] = Hang()
			default:
				faults[j] = Latency(ruleSeed+uint64(j)+1, f.Min, f.Max)
			}
		}
		var inj Injector = Chain(faults...)
		if len(faults) == 1 {
			inj = faults[0]
		}
		if r.P < 1 {
			inj = Random(ruleSeed, r.P, inj)
		}
		if r.Ops != nil {
			inj = OnOps(inj, r.Ops...)
		}
		injs = append(injs, inj)
	}
	return Any(injs...)
}
