package demo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// child is one server process of the demo.
type child struct {
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	done        chan struct{}
	err         error // set before done is closed
	api, ctl    string
	epoch       int
	startedWith []string
}

// startChild starts argv and waits for its READY line.
func startChild(argv []string, stderr io.Writer) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if stderr == nil {
		stderr = io.Discard
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	c := &child{cmd: cmd, stdin: stdin, done: make(chan struct{}), startedWith: argv}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			if first {
				ready <- sc.Text()
				first = false
			}
		}
		if first {
			close(ready)
		}
		// Wait only after stdout is drained, as os/exec asks.
		c.err = cmd.Wait()
		close(c.done)
	}()
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case line, ok := <-ready:
		if !ok || !strings.HasPrefix(line, "READY ") {
			c.kill()
			return nil, fmt.Errorf("server did not start: %q (exit: %v)", line, c.err)
		}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "api":
				c.api = v
			case "control":
				c.ctl = v
			case "epoch":
				fmt.Sscan(v, &c.epoch)
			}
		}
		if c.api == "" || c.ctl == "" {
			c.kill()
			return nil, fmt.Errorf("server printed a bad READY line: %q", line)
		}
		return c, nil
	case <-timer.C:
		c.kill()
		return nil, errors.New("server did not print READY within 60s")
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// stop asks the server to shut down (EOF on its stdin) and waits, killing
// it after the grace period.
func (c *child) stop(grace time.Duration) error {
	_ = c.stdin.Close()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return c.err
	case <-t.C:
		c.kill()
		return fmt.Errorf("server did not stop within %v; killed", grace)
	}
}
