// Command bench runs the benchmarks of bench/ and writes BENCHMARKS.md:
// `make bench`. It needs root; everything kernel-side happens in network
// namespaces it creates and deletes (also on Ctrl-C and SIGTERM).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/bench"
)

func main() {
	os.Exit(run())
}

func run() int {
	agent := flag.String("agent", "bin/ip-masq-agent", "the agent binary (make build)")
	out := flag.String("out", "", "write the Markdown report to this file (default: BENCHMARKS.md, or standard output with -quick)")
	only := flag.String("only", "", "comma-separated parts to run: control, kernel, data, selectors, live, conntrack, busy, neighbour, cpu (default: all); busy-nft: busy's rows with an nft neighbour alone")
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "" && os.Getenv("BENCH_QUICK") != "0", "tiny sizes, single repetitions: a smoke run of seconds (also BENCH_QUICK=1)")
	timeout := flag.Duration("timeout", 20*time.Minute, "stop and report what was measured after this long")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q\n", flag.Args())
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (it creates network namespaces)")
		return 2
	}
	if _, err := os.Stat(*agent); err != nil {
		fmt.Fprintf(os.Stderr, "bench: the agent binary: %v (run make build)\n", err)
		return 2
	}
	if *out == "" && !*quick {
		*out = "BENCHMARKS.md"
	}
	cfg := bench.Config{Agent: *agent, Quick: *quick, Log: os.Stderr}
	if *only != "" {
		cfg.Parts = strings.Split(*only, ",")
	}

	sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sig, *timeout)
	defer cancel()

	r := bench.Run(ctx, cfg)
	r.Command = "go run ./bench/cmd/bench " + strings.Join(os.Args[1:], " ")
	if sig.Err() != nil {
		fmt.Fprintln(os.Stderr, "bench: interrupted; namespaces deleted; no report written")
		return 130
	}
	md := bench.Markdown(r)
	if *out == "" || *out == "-" {
		fmt.Print(md)
	} else if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	} else {
		fmt.Fprintf(os.Stderr, "bench: wrote %s in %s\n", *out, r.End.Sub(r.Start).Round(time.Second))
	}
	for _, t := range bench.Targets(r) {
		v := "not measured"
		if t.Met != nil {
			v = map[bool]string{true: "met", false: "MISSED"}[*t.Met]
		}
		fmt.Fprintf(os.Stderr, "  %-12s %s: %s\n", v, t.Goal, t.Measured)
	}
	if err := r.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			fmt.Fprintf(os.Stderr, "bench: stopped after -timeout %s; the report says what is missing\n", *timeout)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}
