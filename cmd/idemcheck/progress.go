package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/archlab/idempotency/internal/demo"
)

// progress shows the campaign's progress: a bar redrawn in place with \r
// when stdout is a terminal, plain lines every few seconds (and on every
// phase change) otherwise, so that CI logs stay readable.
type progress struct {
	w   io.Writer
	tty bool

	mu        sync.Mutex
	drawn     bool // a bar is on the current line
	lastLine  time.Time
	lastPhase string
}

const plainEvery = 2 * time.Second

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// demo receives the demo's snapshots.
func (p *progress) demo(s demo.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	frac := 0.0
	if s.Total > 0 {
		frac = min(float64(s.Elapsed)/float64(s.Total), 1)
	}
	stats := fmt.Sprintf("orders %d  requests %d  retries %d  server #%d", s.Orders, s.Requests, s.Retries, s.Epoch)
	if p.tty {
		const width = 24
		n := int(frac * width)
		fmt.Fprintf(p.w, "\r[%s%s] %3.0f%%  %-30s %s\x1b[K", strings.Repeat("#", n), strings.Repeat(".", width-n),
			100*frac, s.Phase, stats)
		p.drawn = true
		return
	}
	now := time.Now()
	if s.Phase == p.lastPhase && now.Sub(p.lastLine) < plainEvery {
		return
	}
	p.lastPhase, p.lastLine = s.Phase, now
	fmt.Fprintf(p.w, "%5.1fs/%v  %s  %s\n", s.Elapsed.Seconds(), s.Total, s.Phase, stats)
}

// lines returns a writer for modes that report progress as text lines; on
// a terminal it ends a bar first.
func (p *progress) lines() io.Writer { return lineWriter{p} }

type lineWriter struct{ p *progress }

func (l lineWriter) Write(b []byte) (int, error) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.p.drawn {
		fmt.Fprintln(l.p.w)
		l.p.drawn = false
	}
	return l.p.w.Write(b)
}

// finish ends a bar's line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
