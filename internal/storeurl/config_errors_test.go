package storeurl

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestUnknownSchemeHidesDSN: a key=value connection string given as
// the store is refused without being quoted back, password and all.
func TestUnknownSchemeHidesDSN(t *testing.T) {
	for _, raw := range []string{
		"host=db user=app password=s3cret",
		"host=db password=s3:cret",
	} {
		_, c, err := Open(context.Background(), raw, Options{})
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, ErrUnknownScheme) {
			t.Errorf("Open(%q) = %v; want ErrUnknownScheme", raw, err)
			continue
		}
		if strings.Contains(err.Error(), "password") {
			t.Errorf("Open(%q) error quotes the connection string: %v", raw, err)
		}
	}
	// A scheme that is one is still named.
	if _, _, err := Open(context.Background(), "mysql://u:p@h/db", Options{}); err == nil || !strings.Contains(err.Error(), `"mysql"`) {
		t.Errorf("Open(mysql://...) = %v; want the scheme named", err)
	}
}

// TestMalformedQueryRejected: a query that url.Query cannot parse
// whole used to lose the malformed pairs without a word, so that
// sslmode=require;... connected with the default sslmode, and
// prefix=a;b shared the default prefix with every other application.
func TestMalformedQueryRejected(t *testing.T) {
	for _, raw := range []string{
		"postgres://127.0.0.1:1/x?sslmode=require;connect_timeout=1",
		"postgres://127.0.0.1:1/x?connect_timeout=1&password=50%zz",
		"redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=100ms&prefix=orders;v2:",
		"redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=100ms&prefix=50%off",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?max_retries=-1&dial_timeout=100ms&prefix=a;b",
	} {
		err := wantInvalid(t, raw)
		if err == nil {
			continue
		}
		if strings.Contains(err.Error(), "zz") || strings.Contains(err.Error(), "off") {
			t.Errorf("Open(%q) error quotes the query: %v", raw, err)
		}
	}
}

// TestBoltLockedSaysSo: a bolt file another process holds fails
// within bbolt's open timeout with an error that says the file is locked,
// not just "timeout".
func TestBoltLockedSaysSo(t *testing.T) {
	raw := "bolt:" + filepath.Join(t.TempDir(), "idem.db")
	_, first, err := Open(context.Background(), raw, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	done := make(chan error, 1)
	go func() {
		// A second Open in this process takes a lock of its own (flock
		// locks belong to the open file), as another process would.
		_, c, err := Open(context.Background(), raw, Options{})
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "locked") {
			t.Fatalf("second Open of a held bolt file = %v; want ErrUnavailable saying the file is locked", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second Open of a held bolt file still waits after 30s")
	}
}

// wantInvalid opens raw, which must fail with ErrInvalidConfig, closing
// whatever it opened; it returns the error, or nil after reporting a
// different answer.
func wantInvalid(t *testing.T, raw string) error {
	t.Helper()
	return wantInvalidWith(t, raw, Options{})
}

// wantInvalidWith is wantInvalid with opts.
func wantInvalidWith(t *testing.T, raw string, opts Options) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	s, c, err := Open(ctx, raw, opts)
	cancel()
	if c != nil {
		c.Close()
	}
	if !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Open(%q) = %T, %v; want ErrInvalidConfig", raw, s, err)
		return nil
	}
	return err
}
