// Command original stands in, in make e2e-cluster, for the original
// iptables ip-masq-agent (github.com/kubernetes-sigs/ip-masq-agent,
// cmd/ip-masq-agent/ip-masq-agent.go), whose image cannot be pulled here. It
// does what the original does at each resync, in the same order and with
// the same commands and rules text, through the iptables-nft binaries copied
// into its image:
//
//  1. reads /etc/config/ip-masq-agent (the ConfigMap's key "config") the
//     original's way: YAML to JSON (sigs.k8s.io/yaml, as
//     k8s.io/apimachinery's util/yaml.ToJSON), then encoding/json into its
//     struct over its defaults, then its validation; no file: the defaults;
//     a bad file: an error, and no rewrite this round;
//  2. iptables -t nat -N CHAIN (EnsureChain; "already exists" is fine);
//  3. iptables -t nat -C POSTROUTING <jump>, and -A if missing (EnsureRule);
//  4. iptables-restore --noflush of "*nat", ":CHAIN - [0:0]" (which flushes
//     the chain), a RETURN per non-masquerade CIDR (link-local first unless
//     masqLinkLocal), the MASQUERADE rule (--random-fully), "COMMIT";
//  5. sleeps resyncInterval.
//
// IPv6 (--enable-ipv6) likewise with ip6tables; --masq-chain names the
// chain (the Kubernetes addon manifest's IP-MASQ, or anything else);
// --to-ports adds, as the original's writeMasqToPortsRules, one MASQUERADE
// rule per protocol (tcp, udp, sctp) and range before the last one, all
// but the last range of each protocol behind "-m statistic --mode random
// --probability" (each range's share of what is left).
// make original-parity (hack/original-parity.sh) checks that it writes the
// same rules as the real agent built from its source.
// -once does one resync and exits (the harness uses it to leave the
// original's rules on a node, as a node whose old agent just stopped has).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	linkLocalCIDR     = "169.254.0.0/16"
	linkLocalCIDRIPv6 = "fe80::/10"

	postroutingCommentFormat = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom %s chain"
	nonMasqRuleComment       = `-m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE"`
	masqRuleComment          = `-m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"`
)

var (
	configPath  = flag.String("config", "/etc/config/ip-masq-agent", "the config file (the original's path is fixed)")
	masqChain   = flag.String("masq-chain", "IP-MASQ-AGENT", "Name of nat chain for iptables masquerade rules.")
	allReserved = flag.Bool("nomasq-all-reserved-ranges", false, "Whether to disable masquerade for all IPv4 ranges reserved by RFCs.")
	enableIPv6  = flag.Bool("enable-ipv6", false, "Whether to enable IPv6.")
	randomFully = flag.Bool("random-fully", true, "Whether to add --random-fully to the masquerade rule.")
	once        = flag.Bool("once", false, "one resync, then exit (not the original's)")
	iptables    = flag.String("iptables", "iptables-nft", "the iptables binary (ip6tables: the same with ip6 for ip)")
	toPorts     = flag.String("to-ports", "", `Masquerade to specified ports only, example: "1024-29999,32768-65535"; applicable to tcp, udp, sctp protocols.`)
)

// portRange is one range of --to-ports.
type portRange struct{ first, last int }

func (r portRange) size() int { return r.last - r.first + 1 }

func (r portRange) String() string {
	if r.first == r.last {
		return strconv.Itoa(r.first)
	}
	return fmt.Sprintf("%d-%d", r.first, r.last)
}

// parsePorts is the original's interval.ParseIntervals: ports or FIRST-LAST
// ranges separated by commas.
func parsePorts(s string) ([]portRange, error) {
	if s == "" {
		return nil, nil
	}
	var out []portRange
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(part, "-")
		if len(f) > 2 {
			return nil, fmt.Errorf("invalid interval %q", part)
		}
		a, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, err
		}
		b := a
		if len(f) == 2 {
			if b, err = strconv.Atoi(f[1]); err != nil {
				return nil, err
			}
		}
		if a > b {
			return nil, fmt.Errorf("invalid interval %q", part)
		}
		out = append(out, portRange{a, b})
	}
	return out, nil
}

// duration is metav1.Duration's JSON form: a string for time.ParseDuration.
type duration struct{ time.Duration }

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }

// masqConfig is the original's MasqConfig.
type masqConfig struct {
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`
	CidrLimit          int      `json:"cidrLimit"`
	MasqLinkLocal      bool     `json:"masqLinkLocal"`
	MasqLinkLocalIPv6  bool     `json:"masqLinkLocalIPv6"`
	ResyncInterval     duration `json:"resyncInterval"`
}

func defaults() *masqConfig {
	nonMasq := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	if *allReserved {
		nonMasq = append(nonMasq, "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")
	}
	return &masqConfig{NonMasqueradeCIDRs: nonMasq, CidrLimit: 64, ResyncInterval: duration{60 * time.Second}}
}

func main() {
	flag.Parse()
	if _, err := parsePorts(*toPorts); err != nil {
		log.Fatalf("Invalid --to-ports flag %q: %v", *toPorts, err)
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	// The pod's SIGTERM ends it at once (the original dies with it too).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sig
		log.Printf("%v: exiting", s)
		os.Exit(0)
	}()
	cfg := defaults()
	for {
		err := resync(&cfg)
		if err != nil {
			log.Printf("Error: %v", err)
		}
		if *once {
			if err != nil {
				os.Exit(1)
			}
			return
		}
		time.Sleep(cfg.ResyncInterval.Duration)
	}
}

// resync is one round of the original's Run loop.
func resync(cfg **masqConfig) error {
	c, err := readConfig()
	if err != nil {
		return fmt.Errorf("syncing configuration: %w", err)
	}
	*cfg = c
	j, _ := json.Marshal(c)
	log.Printf("Using config: %s", j)
	if err := syncRules("ip", c); err != nil {
		return fmt.Errorf("syncing masquerade rules: %w", err)
	}
	if *enableIPv6 {
		if err := syncRules("ip6", c); err != nil {
			return fmt.Errorf("syncing masquerade rules for IPv6: %w", err)
		}
	}
	return nil
}

func readConfig() (*masqConfig, error) {
	c := defaults()
	if _, err := os.Stat(*configPath); os.IsNotExist(err) {
		log.Printf("No config file found at %q, using default values", *configPath)
		return c, nil
	}
	y, err := os.ReadFile(*configPath)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(j, c); err != nil {
		return nil, err
	}
	if n, l := len(c.NonMasqueradeCIDRs), c.CidrLimit; n > l {
		return nil, fmt.Errorf("the daemon can only accept up to %d CIDRs (excluding link-local), but got %d CIDRs (excluding link local)", l, n)
	}
	for _, cidr := range c.NonMasqueradeCIDRs {
		ip, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, fmt.Errorf("CIDR %q could not be parsed, %v", cidr, err)
		}
		if !ip.Equal(ipnet.IP) {
			return nil, fmt.Errorf("CIDR %q is not aligned to a CIDR block, ip: %q network: %q", cidr, ip, ipnet.String())
		}
		if !*enableIPv6 && isIPv6CIDR(cidr) {
			return nil, fmt.Errorf("ipv6 is not enabled, but ipv6 cidr %s provided. Enable ipv6 using --enable-ipv6 agent flag", cidr)
		}
	}
	return c, nil
}

func isIPv6CIDR(cidr string) bool {
	ip, _, _ := net.ParseCIDR(cidr)
	return ip.To4() == nil
}

// Rules returns the iptables-restore input the original writes for family
// "ip" or "ip6".
func Rules(family string, c *masqConfig) string {
	var b bytes.Buffer
	line := func(words ...string) { b.WriteString(strings.Join(words, " ") + "\n") }
	line("*nat")
	line(":" + *masqChain + " - [0:0]")
	v6 := family == "ip6"
	if !v6 && !c.MasqLinkLocal {
		line("-A", *masqChain, nonMasqRuleComment, "-d", linkLocalCIDR, "-j", "RETURN")
	}
	if v6 && !c.MasqLinkLocalIPv6 {
		line("-A", *masqChain, nonMasqRuleComment, "-d", linkLocalCIDRIPv6, "-j", "RETURN")
	}
	for _, cidr := range c.NonMasqueradeCIDRs {
		if isIPv6CIDR(cidr) == v6 {
			line("-A", *masqChain, nonMasqRuleComment, "-d", cidr, "-j", "RETURN")
		}
	}
	masq := []string{"-A", *masqChain, masqRuleComment, "-j", "MASQUERADE"}
	if *randomFully { // iptables >= 1.6.2 has it
		masq = append(masq, "--random-fully")
	}
	ports, _ := parsePorts(*toPorts) // checked at start
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		total := 0
		for _, r := range ports {
			total += r.size()
		}
		for _, r := range ports {
			args := append(slices.Clone(masq), "-p", proto)
			if total != r.size() {
				args = append(args, "-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(float64(r.size())/float64(total), 'f', -1, 64))
			}
			total -= r.size()
			line(append(args, "--to-ports", r.String())...)
		}
	}
	line(masq...)
	line("COMMIT")
	return b.String()
}

// syncRules is the original's syncMasqRules: EnsureChain, EnsureRule (the
// POSTROUTING jump), then RestoreAll with --noflush.
func syncRules(family string, c *masqConfig) error {
	bin := *iptables
	if family == "ip6" {
		bin = strings.Replace(bin, "iptables", "ip6tables", 1)
	}
	// The flags k8s.io/kubernetes/pkg/util/iptables passes.
	wait := []string{"-w", "5", "-W", "100000"}
	// EnsureChain: exit status 1 means it exists.
	if out, err := exec.Command(bin, append(wait, "-N", *masqChain, "-t", "nat")...).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return fmt.Errorf("%s -N %s: %v: %s", bin, *masqChain, err, out)
		}
	}
	jump := []string{"-m", "comment", "--comment", fmt.Sprintf(postroutingCommentFormat, *masqChain),
		"-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", *masqChain}
	if err := exec.Command(bin, append(append(wait, "-C", "POSTROUTING", "-t", "nat"), jump...)...).Run(); err != nil {
		if out, err := exec.Command(bin, append(append(wait, "-A", "POSTROUTING", "-t", "nat"), jump...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("failed to ensure that nat chain %s jumps to MASQUERADE: %v: %s", *masqChain, err, out)
		}
	}
	rules := Rules(family, c)
	log.Printf("%s masquerading rules: %q", map[string]string{"ip": "IPv4", "ip6": "IPv6"}[family], rules)
	cmd := exec.Command(bin+"-restore", append(wait, "--noflush")...)
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s-restore --noflush: %v: %s", bin, err, out)
	}
	return nil
}
