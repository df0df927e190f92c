package boltstore

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildVar); path != "" {
		// A child of TestCrash: run the write storm instead of the tests
		// until the parent kills it.
		if err := crashChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "crash child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if path := os.Getenv(holdChildVar); path != "" {
		// A child of TestOpenHeldByProcess: hold the file until killed.
		if err := holdChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "hold child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if path := os.Getenv(lifecycleChildVar); path != "" {
		// A child of TestCrashKeepsExtendReleaseDelete: Extend, Release
		// and Delete until killed.
		if err := lifecycleChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "lifecycle child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if path := os.Getenv(searchOnlyChildVar); path != "" {
		// A child of TestOpenInSearchOnlyDir, run as nobody.
		if err := searchOnlyChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "open:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	// Every Store a test opens is closed, so no committer may outlive it.
	goleak.VerifyTestMain(m)
}
