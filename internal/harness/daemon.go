package harness

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// StopTimeout is how long Stop waits for the process to exit after
// SIGTERM before it kills it.
const StopTimeout = 10 * time.Second

// ErrNoExit is Stop's error when the process outlived StopTimeout.
var ErrNoExit = fmt.Errorf("the agent did not exit within %s of SIGTERM", StopTimeout)

// Daemon is a process (the agent, or a command that runs it) whose
// standard output and error are kept, each write with the time it arrived.
type Daemon struct {
	Cmd *exec.Cmd
	// Started is the time just before the fork.
	Started time.Time
	// MaxLog, when not 0, is the size past which later writes are
	// dropped (a benchmark's agent runs for long at --v=2).
	MaxLog int
	// KillToStop: the process is a wrapper that ignores SIGTERM while it
	// waits and passes it on when killed (unshare --fork
	// --kill-child=SIGTERM): Stop kills it, and its exit status says
	// nothing about the agent's.
	KillToStop bool

	mu     sync.Mutex
	logs   strings.Builder // String does not copy
	writes []timedWrite
	wrote  chan struct{} // closed (and replaced) at each write
	exited chan struct{} // closed when Wait has returned
	err    error         // Wait's error, set before exited is closed
}

// timedWrite is one write of the log (slog writes a line at a time).
type timedWrite struct {
	at  time.Time
	end int // offset in the log after the write
}

// New returns a Daemon of cmd, not started.
func New(cmd *exec.Cmd) *Daemon {
	return &Daemon{Cmd: cmd, wrote: make(chan struct{}), exited: make(chan struct{})}
}

// Start starts the process in this process's network namespace.
func (d *Daemon) Start() error {
	return d.start(func() error { d.Started = time.Now(); return d.Cmd.Start() })
}

// StartIn starts the process inside network namespace ns: forked from an
// OS thread that is inside ns for the duration of the fork (children
// inherit the forking thread's namespace), which costs less than
// `ip netns exec` and adds less to what a benchmark times.
func (d *Daemon) StartIn(ns netns.NsHandle) error {
	return d.start(func() error {
		return testnet.InNS(ns, func() error { d.Started = time.Now(); return d.Cmd.Start() })
	})
}

func (d *Daemon) start(fork func() error) error {
	d.Cmd.Stdout, d.Cmd.Stderr = d, d
	if err := fork(); err != nil {
		return err
	}
	go func() { d.err = d.Cmd.Wait(); close(d.exited) }()
	return nil
}

func (d *Daemon) Write(p []byte) (int, error) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.MaxLog == 0 || d.logs.Len() < d.MaxLog {
		d.logs.Write(p)
		d.writes = append(d.writes, timedWrite{at: now, end: d.logs.Len()})
		close(d.wrote)
		d.wrote = make(chan struct{})
	}
	return len(p), nil
}

// Output is the log so far.
func (d *Daemon) Output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// Pid is the process's id.
func (d *Daemon) Pid() int { return d.Cmd.Process.Pid }

// Exited is closed when the process has exited and its output is read.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// Err is the process's exit error once Exited is closed.
func (d *Daemon) Err() error {
	<-d.exited
	return d.err
}

// line returns the first whole log line containing marker and when the
// write that completed it arrived. d.mu is held.
func (d *Daemon) line(marker string) (string, time.Time, bool) {
	s := d.logs.String()
	i := strings.Index(s, marker)
	if i < 0 {
		return "", time.Time{}, false
	}
	start := strings.LastIndexByte(s[:i], '\n') + 1
	end := strings.IndexByte(s[i:], '\n')
	if end < 0 {
		return "", time.Time{}, false // not whole yet
	}
	end += i
	for _, w := range d.writes {
		if w.end > end {
			return s[start:end], w.at, true
		}
	}
	return "", time.Time{}, false
}

// Wait waits until cond holds for the log, looking again at each write:
// it fails when ctx ends, when timeout has passed (saying it waited for
// what) or when the process exits first.
func (d *Daemon) Wait(ctx context.Context, timeout time.Duration, what string, cond func(log string) bool) error {
	return d.wait(ctx, timeout, what, func() bool { return cond(d.logs.String()) })
}

// wait is Wait with cond called while d.mu is held.
func (d *Daemon) wait(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	check := func() (bool, <-chan struct{}) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return cond(), d.wrote
	}
	for {
		ok, wrote := check()
		if ok {
			return nil
		}
		select {
		case <-wrote:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("no %s within %s: %s", what, timeout, Tail(d.Output(), 600))
		case <-d.exited:
			if ok, _ := check(); ok { // its last words
				return nil
			}
			return fmt.Errorf("the agent exited (%v) before %s: %s", d.err, what, Tail(d.Output(), 600))
		}
	}
}

// WaitLine waits for a whole log line holding one of markers (the first
// of them that has one) and returns the line and when the write that
// completed it arrived.
func (d *Daemon) WaitLine(ctx context.Context, timeout time.Duration, markers ...string) (line string, at time.Time, err error) {
	err = d.wait(ctx, timeout, fmt.Sprintf("line with %q", markers), func() bool {
		for _, m := range markers {
			var ok bool
			if line, at, ok = d.line(m); ok {
				return true
			}
		}
		return false
	})
	return line, at, err
}

// WaitCount waits until the log holds n lines with marker.
func (d *Daemon) WaitCount(ctx context.Context, timeout time.Duration, marker string, n int) error {
	return d.Wait(ctx, timeout, fmt.Sprintf("%d lines with %q", n, marker), func(log string) bool {
		return strings.Count(log, marker) >= n
	})
}

// Stop ends the process: SIGTERM (or SIGKILL of a KillToStop wrapper),
// and after StopTimeout SIGKILL. It returns ErrNoExit, or else the
// process's exit error.
func (d *Daemon) Stop() error {
	select {
	case <-d.exited:
		return d.err
	default:
	}
	if d.KillToStop {
		d.Cmd.Process.Kill()
	} else {
		d.Cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-d.exited:
		return d.err
	case <-time.After(StopTimeout):
		d.Cmd.Process.Kill()
		<-d.exited
		return ErrNoExit
	}
}

// Tail is the end of s, at most n bytes, trimmed.
func Tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
