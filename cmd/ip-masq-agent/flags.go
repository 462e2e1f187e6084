package main

import (
	"flag"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// rulesetFlags are the original agent's flags, which decide the ruleset:
// the daemon and the render, explain and diff commands share them, so
// that a command sees exactly what the daemon would program.
type rulesetFlags struct {
	configPath string
	flags      config.Flags
	nft        nft.Options
	toPorts    string
}

// register defines the flags on fs, with the original agent's defaults.
func (r *rulesetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.configPath, "config", config.DefaultPath,
		"config file (YAML or JSON), or a directory whose files named ip-masq* are merged; missing means defaults")
	r.registerValidation(fs)
	fs.BoolVar(&r.nft.RandomFully, "random-fully", true, "whether to masquerade with fully-random source ports")
	fs.StringVar(&r.toPorts, "to-ports", "", `masquerade to these source ports only, e.g. "1024-29999,32768-65535"; applies to tcp, udp and sctp`)
	fs.StringVar(&r.nft.Chain, "masq-chain", nft.DefaultChain, "name of the nft chain that holds the masquerade decisions")
}

// registerValidation defines the flags that change what a config means
// and whether it is valid (validate takes only these).
func (r *rulesetFlags) registerValidation(fs *flag.FlagSet) {
	fs.BoolVar(&r.flags.NoMasqAllReservedRanges, "nomasq-all-reserved-ranges", false,
		"whether to disable masquerade for all IPv4 ranges reserved by RFCs (default nonMasqueradeCIDRs only)")
	fs.BoolVar(&r.flags.EnableIPv6, "enable-ipv6", false, "whether to enable IPv6 (rules and IPv6 CIDRs)")
}

// finish checks and completes the flags after parsing.
func (r *rulesetFlags) finish() error {
	if err := nft.ValidateChain(r.nft.Chain); err != nil {
		return err
	}
	ports, err := nft.ParsePorts(r.toPorts)
	if err != nil {
		return err
	}
	r.nft.ToPorts = ports
	r.nft.EnableIPv6 = r.flags.EnableIPv6
	return nil
}
