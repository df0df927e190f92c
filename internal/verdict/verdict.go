// Package verdict collects the results of idemcheck's checks and prints
// them: a table of checks with counts, then the closing line
// "N passed, M failed" that CI and people read.
package verdict

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
)

// maxExamples bounds the failure examples kept per check.
const maxExamples = 5

// Check is one named property and what was seen of it.
type Check struct {
	Name string
	// Passed and Failed count observations: requests, keys, operations.
	Passed, Failed int
	// Examples describe the first failures, for the report.
	Examples []string
	// Skipped, when set, says why the check could not run; it neither
	// passes nor fails, unless a violation was recorded before it was
	// skipped: what was seen stands.
	Skipped string
	// Notes say how the check was met where that is worth knowing (a
	// target held it in an unexpected but safe way); they change nothing.
	Notes []string
}

// OK reports whether the check held: it was observed and never failed.
func (c Check) OK() bool { return c.Skipped == "" && c.Failed == 0 && c.Passed > 0 }

// Report is a set of checks, safe for concurrent use.
type Report struct {
	mu     sync.Mutex
	order  []string
	checks map[string]*Check
}

// New returns an empty Report.
func New() *Report { return &Report{checks: map[string]*Check{}} }

func (r *Report) get(name string) *Check {
	c, ok := r.checks[name]
	if !ok {
		c = &Check{Name: name}
		r.checks[name] = c
		r.order = append(r.order, name)
	}
	return c
}

// Declare makes a check appear in the report even if nothing is observed
// (it then counts as failed: a property that was never exercised is not
// proven).
func (r *Report) Declare(names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		r.get(n)
	}
}

// Pass records one observation that held.
func (r *Report) Pass(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.get(name).Passed++
}

// Fail records one violation, with an example.
func (r *Report) Fail(name, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.get(name)
	c.Failed++
	if len(c.Examples) < maxExamples {
		c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
	}
}

// Check records an observation: Pass if ok, else Fail with the example.
func (r *Report) Check(name string, ok bool, format string, args ...any) bool {
	if ok {
		r.Pass(name)
	} else {
		r.Fail(name, format, args...)
	}
	return ok
}

// Note attaches a remark to a check, printed under the table; it neither
// passes nor fails the check.
func (r *Report) Note(name, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.get(name)
	if len(c.Notes) < maxExamples {
		c.Notes = append(c.Notes, fmt.Sprintf(format, args...))
	}
}

// Skip marks a check as not run, with the reason.
func (r *Report) Skip(name, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.get(name).Skipped = why
}

// Checks returns a copy of the checks, in the order they first appeared.
func (r *Report) Checks() []Check {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Check, 0, len(r.order))
	for _, n := range r.order {
		c := *r.checks[n]
		c.Examples = slices.Clone(c.Examples)
		c.Notes = slices.Clone(c.Notes)
		out = append(out, c)
	}
	return out
}

// Counts returns how many checks held and how many did not (skipped checks
// are in neither, unless a violation was recorded first).
func (r *Report) Counts() (passed, failed int) {
	for _, c := range r.Checks() {
		switch {
		case c.Failed > 0:
			failed++
		case c.Skipped != "":
		case c.OK():
			passed++
		default:
			failed++
		}
	}
	return passed, failed
}

// OK reports whether every check that ran held and at least one did. A
// report that judged nothing (no checks, or every one skipped) is not OK:
// a check that was not run proves nothing, and neither do none.
func (r *Report) OK() bool {
	passed, failed := r.Counts()
	return failed == 0 && passed > 0
}

// Write prints the table, the failure examples and the closing line
// "N passed, M failed".
func (r *Report) Write(w io.Writer) error {
	checks := r.Checks()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tHELD\tVIOLATED")
	for _, c := range checks {
		result := "ok"
		switch {
		case c.Failed > 0:
			result = "FAILED"
		case c.Skipped != "":
			result = "skipped"
		case c.Passed == 0:
			result = "FAILED (not exercised)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", c.Name, result, c.Passed, c.Failed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range checks {
		if c.Skipped != "" {
			fmt.Fprintf(w, "\n%s: skipped: %s\n", c.Name, c.Skipped)
		}
		for _, n := range c.Notes {
			fmt.Fprintf(w, "\n%s: note: %s\n", c.Name, n)
		}
		if len(c.Examples) > 0 {
			fmt.Fprintf(w, "\n%s violated %d time(s), e.g.:\n", c.Name, c.Failed)
			for _, e := range c.Examples {
				fmt.Fprintf(w, "  - %s\n", strings.ReplaceAll(e, "\n", "\n    "))
			}
		}
	}
	passed, failed := r.Counts()
	_, err := fmt.Fprintf(w, "\n%d passed, %d failed\n", passed, failed)
	return err
}
