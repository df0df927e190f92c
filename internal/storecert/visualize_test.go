package storecert

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/verdict"
)

// doubleClaim is a campaign whose history holds a double claim, with opts.
func doubleClaim(opts Options) (*campaign, *verdict.Report) {
	rec := newRecorder(idempotency.NewMemoryStore(), time.Second, false)
	rec.ops = []op{
		hop(0, 1, 2, input{kind: opBegin, fp: "fp"}, claimOut(5, 1)),
		hop(1, 3, 4, input{kind: opBegin, fp: "fp"}, claimOut(5, 3)),
	}
	rep := verdict.New()
	return &campaign{rec: rec, rep: rep, opts: opts}, rep
}

// A failed linearizability check writes no file unless asked to: not to
// the temporary directory, nor anywhere else.
func TestNoVisualizationUnasked(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	c, rep := doubleClaim(Options{Duration: time.Second})
	c.checkLinearizable()
	out := report(rep)
	if rep.OK() || !strings.Contains(out, checkLinearHist) {
		t.Fatalf("report of a double claim:\n%s", out)
	}
	files, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		t.Errorf("unasked, the check left %s in the temporary directory", f.Name())
	}
}

// Asked, it draws each illegal history into the directory given, and the
// report names the file.
func TestVisualizationWhereAsked(t *testing.T) {
	dir := t.TempDir()
	c, rep := doubleClaim(Options{Duration: time.Second, Visualize: dir})
	c.checkLinearizable()
	out := report(rep)
	files, err := filepath.Glob(filepath.Join(dir, "*.html"))
	if err != nil || len(files) != 1 {
		t.Fatalf("%d visualizations in %s (%v), want 1; report:\n%s", len(files), dir, err, out)
	}
	if !strings.Contains(out, files[0]) {
		t.Errorf("the report does not name %s:\n%s", files[0], out)
	}
	b, err := os.ReadFile(files[0])
	if err != nil || !strings.Contains(string(b), "<html") {
		t.Errorf("visualization %s: %v (%d bytes)", files[0], err, len(b))
	}
}
