package verdict

import (
	"strings"
	"sync"
	"testing"
)

func TestReport(t *testing.T) {
	r := New()
	r.Declare("never exercised")
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			r.Check("replay equals first answer", true, "")
			r.Check("charged at most once", i != 7, "key k%d charged twice", i)
		})
	}
	wg.Wait()
	r.Skip("paused store", "no store to pause")
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"replay equals first answer  ok",
		"charged at most once        FAILED",
		"key k7 charged twice",
		"never exercised             FAILED (not exercised)",
		"paused store: skipped: no store to pause",
		"\n1 passed, 2 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if r.OK() {
		t.Error("OK() with failures")
	}
}

// A check skipped after it was violated stays violated: the reason it
// could not run to the end does not undo what was seen.
func TestSkipKeepsFailures(t *testing.T) {
	r := New()
	r.Pass("a")
	r.Fail("a", "key %d ran twice", 1)
	r.Skip("a", "nothing more could be judged")
	if r.OK() {
		t.Error("OK() after a violation, then a skip")
	}
	if passed, failed := r.Counts(); passed != 0 || failed != 1 {
		t.Errorf("Counts() = %d, %d; want 0, 1", passed, failed)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "FAILED") || !strings.HasSuffix(b.String(), "0 passed, 1 failed\n") {
		t.Errorf("report does not show the violation:\n%s", b.String())
	}
}

// A report in which nothing was judged (no checks, or every one skipped)
// proves nothing: it is not OK, though nothing failed.
func TestNothingJudgedIsNotOK(t *testing.T) {
	for _, tc := range []struct {
		name string
		fill func(*Report)
	}{
		{"no checks", func(*Report) {}},
		{"every check skipped", func(r *Report) {
			r.Declare("a", "b")
			r.Skip("a", "no replay was observed")
			r.Skip("b", "only one credential set")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			tc.fill(r)
			if passed, failed := r.Counts(); passed != 0 || failed != 0 {
				t.Fatalf("Counts() = %d, %d; want 0, 0", passed, failed)
			}
			if r.OK() {
				t.Error("OK() for a report that judged nothing")
			}
		})
	}
	r := New()
	r.Skip("a", "no replay was observed")
	r.Pass("b")
	if !r.OK() {
		t.Error("not OK() with one check held and the other skipped")
	}
}

// Notes are printed under the table and change no verdict.
func TestNotes(t *testing.T) {
	r := New()
	r.Pass("scope")
	r.Note("scope", "refused %d of %d", 3, 4)
	if !r.OK() {
		t.Error("a note failed the report")
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\nscope: note: refused 3 of 4\n") || !strings.HasSuffix(b.String(), "\n1 passed, 0 failed\n") {
		t.Errorf("report does not show the note, or not before the closing line:\n%s", b.String())
	}
}
