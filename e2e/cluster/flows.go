package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// streamSummary is what `client stream` prints.
type streamSummary struct {
	Local     string `json:"local"`
	Flows     int    `json:"flows"`
	StoppedBy string `json:"stopped_by"`
	Seconds   float64
	Dest      map[string]struct {
		Flows       int            `json:"flows"`
		Seen        map[string]int `json:"seen"`
		Errors      int            `json:"errors"`
		FirstErrors []string       `json:"first_errors"`
	} `json:"dest"`
}

// flowStream is the flow checker: the client pod opens a new connection
// every 20 ms, in turn to each destination, until stopped; each is a new
// flow, whose source the pod's view and the server's count both judge
// against want (destination -> the source it must see).
type flowStream struct {
	s              *suite
	want           map[string]string
	snap0          map[[2]string]int
	total0         int64
	cancel         context.CancelFunc
	done           chan error
	stdout, stderr bytes.Buffer
}

// flowResult is what a stopped stream found.
type flowResult struct {
	sum                      streamSummary
	wrong, errs              int // the client's view
	serverWrong, serverFlows int // the server's count of the same flows
}

// startFlows starts the stream and returns once 25 flows have been seen.
func (s *suite) startFlows(want map[string]string, maxDuration time.Duration) (*flowStream, error) {
	f := &flowStream{s: s, want: want, snap0: s.echo.snapshot(), total0: s.echo.total.Load(), done: make(chan error, 1)}
	var dsts []string
	for d := range want {
		dsts = append(dsts, fmt.Sprintf("%s:%d", d, echoPort))
	}
	// A fixed order: alternate between masqueraded and not where possible.
	sortDsts(dsts, want)
	argv := s.n.inNode(append([]string{filepath.Join(s.kubeBin, "kubectl"), "--kubeconfig=" + s.admin, "--cache-dir=" + s.n.path("kubectl-cache"),
		"-n", "default", "exec", "e2e-client", "--", "/client", "stream", "-interval=20ms", "-max-duration=" + maxDuration.String()}, dsts...)...)
	ctx, cancel := context.WithTimeout(s.ctx, maxDuration+30*time.Second)
	f.cancel = cancel
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = baseEnv(s.n)
	cmd.Stdout, cmd.Stderr = &f.stdout, &f.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() { f.done <- cmd.Wait() }()
	if err := f.waitMore(f.total0+25, "the stream to start"); err != nil {
		cancel()
		return nil, err
	}
	return f, nil
}

// sortDsts orders the destinations so that their expected sources alternate.
func sortDsts(dsts []string, want map[string]string) {
	key := func(d string) string { return want[strings.Split(d, ":")[0]] + " " + d }
	for i := range dsts {
		for j := i + 1; j < len(dsts); j++ {
			if key(dsts[j]) < key(dsts[i]) {
				dsts[i], dsts[j] = dsts[j], dsts[i]
			}
		}
	}
	// a b b -> b a b (with two sources): interleave.
	if len(dsts) == 3 && want[strings.Split(dsts[1], ":")[0]] != want[strings.Split(dsts[0], ":")[0]] {
		dsts[0], dsts[1] = dsts[1], dsts[0]
	}
}

// waitMore waits until the server has counted n connections in all, failing
// if the stream ended.
func (f *flowStream) waitMore(n int64, what string) error {
	return waitFor(f.s.ctx, what, 60*time.Second, 50*time.Millisecond, func() (bool, string, error) {
		select {
		case err := <-f.done:
			f.done <- err
			return false, "", fmt.Errorf("the stream ended early: %v: %s %s", err, f.stderr.String(), f.stdout.String())
		default:
		}
		c := f.s.echo.total.Load()
		return c >= n, fmt.Sprintf("%d connections", c), nil
	})
}

// stop lets 25 more flows through, then has the server tell the client to
// stop, and judges every flow of the stream.
func (f *flowStream) stop() (flowResult, error) {
	defer f.cancel()
	var r flowResult
	s := f.s
	werr := f.waitMore(s.echo.total.Load()+25, "the stream's last flows")
	s.echo.stop.Store(true)
	var cerr error
	select {
	case cerr = <-f.done:
	case <-time.After(60 * time.Second):
		cerr = errors.New("the stream did not stop within 60s of the server's stop")
		f.cancel()
	}
	s.echo.stop.Store(false)
	if werr != nil {
		return r, werr
	}
	if cerr != nil {
		return r, fmt.Errorf("client stream: %v: %s %s", cerr, f.stderr.String(), f.stdout.String())
	}
	if err := json.Unmarshal(bytes.TrimSpace(f.stdout.Bytes()), &r.sum); err != nil {
		return r, fmt.Errorf("client stream output %q: %w", f.stdout.String(), err)
	}
	for dst, w := range f.want {
		d := r.sum.Dest[fmt.Sprintf("%s:%d", dst, echoPort)]
		for src, c := range d.Seen {
			if src != w {
				r.wrong += c
			}
		}
		r.errs += d.Errors
		s.logf("  %s: %d flows, sources seen %v, %d errors %v", dst, d.Flows, d.Seen, d.Errors, d.FirstErrors)
	}
	snap1 := s.echo.snapshot()
	for k, c := range snap1 {
		c -= f.snap0[k]
		if c == 0 {
			continue
		}
		if w, ok := f.want[k[0]]; ok {
			r.serverFlows += c
			if k[1] != w {
				r.serverWrong += c
			}
		}
	}
	return r, nil
}
