package nft

// RuleCounter is one kind of SNAT decision the kernel counts: the packets
// and bytes of one decision rule's counter (or the sum of several with
// the same labels), labelled as /metrics exports it.
type RuleCounter struct {
	Family         string // "ipv4" or "ipv6"
	Decision       string // "masquerade" or "nonmasquerade" (the rule returns: left alone)
	Reason         string // "cidrs" (a CIDR of the decision's set), "sources" (a source CIDR's) or "outbound" (no set matched)
	Packets, Bytes uint64
}

// DecisionCounters labels the counters of the decision chain's rules,
// as read from the kernel; rules the agent did not write are left out.
func DecisionCounters(rules []Rule) []RuleCounter {
	var out []RuleCounter
	for _, r := range rules {
		if r.Foreign != "" {
			continue
		}
		rc := RuleCounter{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: r.Packets, Bytes: r.Bytes}
		if r.Family == 6 {
			rc.Family = "ipv6"
		}
		if d := decisionOf(r.Set); d != nil {
			rc.Decision, rc.Reason = d.outcome(), d.reason
		}
		out = append(out, rc)
	}
	return out
}
