// Command demo shows the agent at work in throwaway network namespaces: a
// pod, a node running the agent, and an external host. Run it as root with
// `make demo`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// exampleConfig is the README's example.
const exampleConfig = `nonMasqueradeCIDRs:
  - 10.0.0.0/8
  - 198.51.100.0/24
masqLinkLocal: false
resyncInterval: 60s
`

func main() {
	agent := flag.String("agent", "bin/ip-masq-agent", "the agent binary")
	flag.Parse()
	if err := run(*agent); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(agent string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: it creates network namespaces (try: sudo make demo)")
	}
	if reason := testnet.MissingReason("ip"); reason != "" {
		return errors.New(reason)
	}
	agent, err := filepath.Abs(agent)
	if err != nil {
		return err
	}
	topo, err := testnet.New("demo")
	if err != nil {
		return fmt.Errorf("create namespaces: %w", err)
	}
	// Delete the namespaces also on Ctrl-C.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); topo.Close() }()
	defer topo.Close()

	dests := []struct{ addr, what string }{
		{"198.51.100.10", "a partner network, in nonMasqueradeCIDRs"},
		{"10.250.0.10", "another cluster network, in nonMasqueradeCIDRs"},
		{"203.0.113.10", "the internet"},
	}
	for _, d := range dests {
		if err := topo.AddDestination(netip.MustParseAddr(d.addr)); err != nil {
			return err
		}
	}
	fmt.Printf("Namespaces: pod %s (%s), node %s (uplink %s), external %s\n\n",
		topo.PodNS, topo.Pod4, topo.NodeNS, topo.NodeUplink4, topo.ExtNS)

	dir, err := os.MkdirTemp("", "ip-masq-agent-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "ip-masq-agent")
	if err := os.WriteFile(cfg, []byte(exampleConfig), 0o644); err != nil {
		return err
	}
	fmt.Printf("$ cat /etc/config/ip-masq-agent\n%s\n", exampleConfig)
	fmt.Println("$ ip-masq-agent --once   (in the node's namespace)")
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := topo.RunInNode(actx, agent, "--once", "--config", cfg)
	fmt.Print(string(out))
	if err != nil {
		return fmt.Errorf("the agent failed: %w", err)
	}
	list := func() error {
		out, err := topo.RunInNode(actx, agent, "list")
		if err != nil {
			return fmt.Errorf("ip-masq-agent list: %w\n%s", err, out)
		}
		fmt.Printf("\n$ ip-masq-agent list   (the kernel's table, read by the agent itself: no nft needed)\n%s\n", out)
		return nil
	}
	if err := list(); err != nil {
		return err
	}

	fmt.Printf("New connections from the pod (%s):\n", topo.Pod4)
	for _, d := range dests {
		seen, err := topo.SourceSeen(netip.MustParseAddr(d.addr))
		if err != nil {
			return err
		}
		verdict := "not masqueraded"
		if seen == topo.NodeUplink4 {
			verdict = "masqueraded to the node's address"
		}
		fmt.Printf("  %-15s %-48s saw source %-12s %s\n", d.addr, "("+d.what+")", seen, verdict)
	}
	fmt.Print("\nThe rules' counters now count those connections:")
	if err := list(); err != nil {
		return err
	}
	fmt.Println("Deleting the namespaces.")
	return nil
}
