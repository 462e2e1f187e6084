package nft

// Decide is Decider for one packet, for tests.
func (t Table) Decide(p Packet) (masquerade, handled bool) {
	masq, handled, _ := t.decide(p)
	return masq, handled
}
