// Command client is the e2e cluster's test client, run in a normal
// (non-hostNetwork) pod on the bridge network. Each connection it makes is a
// new flow; the harness's server in the "external" namespace answers every
// connection with one line, the source address it saw ("SRC" or "SRC stop"),
// and closes.
//
//	client wait                          sleep until SIGTERM (the pod's main process)
//	client probe ADDR:PORT...            one connection to each; one line each:
//	                                     "ADDR:PORT local=IP seen=IP" or "ADDR:PORT error=..."
//	client stream [flags] ADDR:PORT...   new connections in turn to each address, every
//	                                     -interval, until the server answers "stop", or
//	                                     -max-duration or -max-flows; prints one JSON summary
//
// Every connection attempt and every read is bounded by -timeout.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: client wait | probe ADDR:PORT... | stream [flags] ADDR:PORT...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "wait":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
	case "probe":
		fs := flag.NewFlagSet("probe", flag.ExitOnError)
		timeout := fs.Duration("timeout", 3*time.Second, "bound on each connection and read")
		_ = fs.Parse(os.Args[2:])
		failed := false
		for _, addr := range fs.Args() {
			local, seen, _, err := flow(addr, *timeout)
			if err != nil {
				failed = true
				fmt.Printf("%s error=%q\n", addr, err.Error())
				continue
			}
			fmt.Printf("%s local=%s seen=%s\n", addr, local, seen)
		}
		if failed {
			os.Exit(1)
		}
	case "stream":
		os.Exit(stream(os.Args[2:]))
	default:
		fmt.Fprintf(os.Stderr, "client: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

// flow opens one TCP connection to addr and returns the local address, the
// source address the server saw, and whether the server asked to stop.
func flow(addr string, timeout time.Duration) (local, seen string, stop bool, err error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", "", false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	local = c.LocalAddr().(*net.TCPAddr).IP.String()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return local, "", false, fmt.Errorf("read: %w", err)
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return local, "", false, fmt.Errorf("empty answer")
	}
	return local, f[0], len(f) > 1 && f[1] == "stop", nil
}

// Summary is what stream prints, as one JSON line.
type Summary struct {
	Local     string                  `json:"local"`      // the pod's address
	Flows     int                     `json:"flows"`      // connections attempted
	StoppedBy string                  `json:"stopped_by"` // "server", "max-duration", "max-flows"
	Seconds   float64                 `json:"seconds"`
	Dest      map[string]*DestSummary `json:"dest"` // by ADDR:PORT
}

// DestSummary counts the flows to one destination by the source the server saw.
type DestSummary struct {
	Flows       int            `json:"flows"`
	Seen        map[string]int `json:"seen"` // source address seen -> flows
	Errors      int            `json:"errors"`
	FirstErrors []string       `json:"first_errors,omitempty"`
}

func stream(args []string) int {
	fs := flag.NewFlagSet("stream", flag.ExitOnError)
	interval := fs.Duration("interval", 20*time.Millisecond, "time between the starts of two connections")
	maxDuration := fs.Duration("max-duration", 3*time.Minute, "stop after this long")
	maxFlows := fs.Int("max-flows", 20000, "stop after this many connections")
	timeout := fs.Duration("timeout", 2*time.Second, "bound on each connection and read")
	_ = fs.Parse(args)
	addrs := fs.Args()
	if len(addrs) == 0 {
		fmt.Fprintln(os.Stderr, "stream: no address")
		return 2
	}
	s := Summary{Dest: map[string]*DestSummary{}}
	for _, a := range addrs {
		s.Dest[a] = &DestSummary{Seen: map[string]int{}}
	}
	start := time.Now()
	fmt.Fprintln(os.Stderr, "stream: started")
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		if i >= *maxFlows {
			s.StoppedBy = "max-flows"
			break
		}
		if time.Since(start) >= *maxDuration {
			s.StoppedBy = "max-duration"
			break
		}
		addr := addrs[i%len(addrs)]
		d := s.Dest[addr]
		s.Flows++
		d.Flows++
		local, seen, stop, err := flow(addr, *timeout)
		if local != "" {
			s.Local = local
		}
		if err != nil {
			d.Errors++
			if len(d.FirstErrors) < 5 {
				d.FirstErrors = append(d.FirstErrors, fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339Nano), err))
			}
		} else {
			d.Seen[seen]++
		}
		if stop {
			s.StoppedBy = "server"
			break
		}
		<-tick.C
	}
	s.Seconds = time.Since(start).Seconds()
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	return 0
}
