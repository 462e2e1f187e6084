#!/bin/sh
# guest.sh OUT [VER]: runs the kernel tests and the smoke test on the
# running kernel and leaves their output in OUT (test.out, test.rc). Run
# by run.sh: in a guest (VER given: the modules to load come from
# /run/kroot/lib/modules/VER, the kernel package's), or on the host's
# kernel directly (no VER: nothing loaded). TESTS and SKIP (regexps of
# test names) come from OUT/env.
set -u
out=$1 ver=${2:-}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
. "$out/env"
if [ -n "$ver" ]; then
	# The kernel's own module autoload does not reach the package's
	# modules: load explicitly what the agent and the tests use (a module
	# built into this kernel loads as nothing).
	for m in nfnetlink nf_tables nf_conntrack nf_nat nf_conntrack_netlink nft_ct nft_nat nft_masq nft_redir \
		nft_chain_nat nft_fib nft_fib_inet nft_fib_ipv4 nft_fib_ipv6 nft_numgen nft_counter nft_objref nft_quota \
		nft_limit nft_reject_inet nft_log nft_compat x_tables xt_MASQUERADE xt_comment xt_addrtype xt_statistic xt_conntrack \
		xt_mark ip_tables ip6_tables iptable_nat ip6table_nat iptable_filter ip6table_filter veth xfrm_user; do
		modprobe -d /run/kroot -S "$ver" "$m" 2>>"$out/modprobe.log" || echo "modprobe $m: failed" >>"$out/modprobe.log"
	done
	ip link set lo up
	hostname "kernel-$ver" 2>/dev/null
fi
uname -r >"$out/uname"
cd "$REPO/test" || exit 1
CI=true IP_MASQ_AGENT_BIN="$BIN/ip-masq-agent" IP_MASQ_AGENT_ORIGINAL_BIN="$BIN/original" "$BIN/test.test" -test.v -test.count=1 -test.timeout="$TIMEOUT" \
	-test.run "$TESTS" ${SKIP:+-test.skip "$SKIP"} >"$out/test.out" 2>&1
rc=$?
if [ "${KERNEL_PKG:-1}" != 0 ] && [ -x "$BIN/kernel.test" ]; then
	# nft/kernel's tests, in their package directory (testdata/), their
	# output after test/'s (one summary counts both).
	cd "$REPO/nft/kernel" || exit 1
	CI=true "$BIN/kernel.test" -test.v -test.count=1 -test.timeout="$TIMEOUT" >>"$out/test.out" 2>&1 || rc=1
fi
echo $rc >"$out/test.rc"
