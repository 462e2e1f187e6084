package harness

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Endpoint is the agent's HTTP endpoint by default (--http-address), on
// the node's loopback.
const Endpoint = "http://127.0.0.1:9753"

// Get gets path from Endpoint with client and returns the status code
// and the body; 0 and the error when there is no answer.
func Get(client *http.Client, path string) (int, string) {
	resp, err := client.Get(Endpoint + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Probes polls paths (/healthz, /readyz) as the kubelet's probes do, from
// WatchProbes until Stop, and keeps every answer that was not 200.
type Probes struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	bad  []string
	n    int
}

// WatchProbes gets each of paths, then again every interval.
func WatchProbes(client *http.Client, every time.Duration, paths ...string) *Probes {
	p := &Probes{stop: make(chan struct{})}
	p.wg.Go(func() {
		for {
			for _, path := range paths {
				code, body := Get(client, path)
				p.mu.Lock()
				p.n++
				if code != http.StatusOK {
					p.bad = append(p.bad, fmt.Sprintf("%s %d %s", path, code, strings.TrimSpace(body)))
				}
				p.mu.Unlock()
			}
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
		}
	})
	return p
}

// Stop stops the polling and returns how many answers there were and
// those that were not 200 ("PATH CODE BODY").
func (p *Probes) Stop() (n int, bad []string) {
	close(p.stop)
	p.wg.Wait()
	return p.n, p.bad
}
