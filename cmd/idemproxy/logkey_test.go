package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLeaseLostLogsNoRawKey: a stores' lease-lost error names the key it
// failed on; the proxy's log line for that request must show the key's
// hash only, like every other line.
func TestLeaseLostLogsNoRawKey(t *testing.T) {
	const key = "secret-key-3f9a"
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "bolt:"+filepath.Join(t.TempDir(), "idem.db"))
	done := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", key, "x")
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran(key) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// An operator evicts the key while the upstream runs: the response
	// cannot be stored (lease lost).
	if r := do(t, http.MethodDelete, "http://"+p.admin+"/keys/"+key); r.status != http.StatusOK {
		t.Fatalf("DELETE = %d %q", r.status, r.body)
	}
	up.open()
	if r := <-done; r.status != http.StatusCreated {
		t.Fatalf("held request = %d %q; want 201", r.status, r.body)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(p.logs.String(), "outcome=lease_lost") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	logs := p.logs.String()
	if !strings.Contains(logs, "outcome=lease_lost") {
		t.Fatalf("no lease_lost line:\n%s", logs)
	}
	if strings.Contains(logs, key) {
		t.Fatalf("the logs show the raw key:\n%s", grepLines(logs, key))
	}
}
