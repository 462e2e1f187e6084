package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// inNetNS runs f on a thread that is inside the network namespace at nsPath
// (a file under /run/netns). Sockets f creates stay in that namespace. The
// thread is returned to the Go scheduler only when it is back in the
// caller's namespace; otherwise it dies with the goroutine.
func inNetNS(nsPath string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		err = f()
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// dialer returns a DialContext that connects from inside the network
// namespace at nsPath.
func dialer(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetNS(nsPath, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// nodeHTTPClient is an HTTP client whose connections start inside the
// network namespace at nsPath.
func nodeHTTPClient(nsPath string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: dialer(nsPath), DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
}

func httpGet(ctx context.Context, c *http.Client, url string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return string(b), resp.StatusCode, err
}

// echoServer is the "external" host's server: it listens on the wildcard
// address in the external namespace, answers every TCP connection with one
// line holding the source address it saw (followed by " stop" once asked to
// stop a stream), and counts connections by destination and source.
type echoServer struct {
	ln    net.Listener
	stop  atomic.Bool
	total atomic.Int64
	mu    sync.Mutex
	seen  map[[2]string]int // {destination, source} -> connections
	wg    sync.WaitGroup
}

func startEcho(nsPath string, port int) (*echoServer, error) {
	s := &echoServer{seen: map[[2]string]int{}}
	err := inNetNS(nsPath, func() (err error) {
		s.ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			src := c.RemoteAddr().(*net.TCPAddr).IP.String()
			dst := c.LocalAddr().(*net.TCPAddr).IP.String()
			s.mu.Lock()
			s.seen[[2]string{dst, src}]++
			s.mu.Unlock()
			s.total.Add(1)
			line := src + "\n"
			if s.stop.Load() {
				line = src + " stop\n"
			}
			_, _ = c.Write([]byte(line))
			_ = c.Close()
		}
	}()
	return s, nil
}

// snapshot returns a copy of the counts.
func (s *echoServer) snapshot() map[[2]string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[[2]string]int, len(s.seen))
	for k, v := range s.seen {
		m[k] = v
	}
	return m
}

func (s *echoServer) close() {
	_ = s.ln.Close()
	s.wg.Wait()
}

// sameNS reports whether the namespace files a and b (e.g. /proc/PID/ns/net
// and /run/netns/NAME) are the same namespace.
func sameNS(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
