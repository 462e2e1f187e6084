package kernel

import (
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// marshalExprs encodes a rule's expressions as NFTA_RULE_EXPRESSIONS.
// masquerade is encoded here: expr.Masq of google/nftables v0.3.0 drops
// fully-random when it has a port range.
func marshalExprs(exprs []expr.Any) ([]byte, error) {
	var list []netlink.Attribute
	for _, e := range exprs {
		b, err := marshalExpr(e)
		if err != nil {
			return nil, err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	return netlink.MarshalAttributes(list)
}

// marshalExpr encodes one expression (NFTA_EXPR_NAME and NFTA_EXPR_DATA).
func marshalExpr(e expr.Any) ([]byte, error) {
	if m, ok := e.(*expr.Masq); ok {
		return masqExpr(m)
	}
	return expr.Marshal(unix.NFPROTO_INET, e)
}

// masqExpr encodes `masquerade [to :min-max] [fully-random]`, flags included.
func masqExpr(m *expr.Masq) ([]byte, error) {
	var flags uint32
	var attrs []netlink.Attribute
	if m.FullyRandom {
		flags |= unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY
	}
	if m.ToPorts {
		flags |= unix.NF_NAT_RANGE_PROTO_SPECIFIED
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MIN, Data: binaryutil.BigEndian.PutUint32(m.RegProtoMin)},
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MAX, Data: binaryutil.BigEndian.PutUint32(m.RegProtoMax)})
	}
	if flags != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_MASQ_FLAGS, Data: binaryutil.BigEndian.PutUint32(flags)})
	}
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: cstring("masq")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}
