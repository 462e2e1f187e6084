#!/bin/sh
# original-parity.sh ORIGINAL STANDIN: `make original-parity`. Checks that
# the stand-in original (e2e/original, STANDIN), which the tests of the
# switch and of the original's inputs run, writes the same iptables rules
# as the real kubernetes-sigs ip-masq-agent (ORIGINAL, built from its
# source: its module is not on the Go module proxy, so neither make test
# nor CI can build it) for each case of hack/original-parity.cases: a
# config and the flags.
#
# Each side runs in a network namespace and a private mount namespace of
# its own (unshare: nothing of the host's is changed, nothing is mounted
# under /run/netns); the real original reads /etc/config/ip-masq-agent,
# which an overlay on /etc inside that mount namespace provides. The real
# original syncs at its start and then sleeps; it is stopped after its
# first sync. Compared: iptables-nft-save -t nat and ip6tables-nft-save -t
# nat, without comments of the tools' own (# Generated ..., counters).
# Prints one line per case and exits 1 if any differs (the diff after it).
set -eu
orig=$1 standin=$2
cases=${ORIGINAL_PARITY_CASES:-$(dirname "$0")/original-parity.cases}
[ "$(id -u)" = 0 ] || { echo "original-parity: needs root (namespaces)" >&2; exit 1; }
for c in unshare iptables-nft-save ip6tables-nft-save timeout; do
	command -v "$c" >/dev/null || { echo "original-parity: $c is missing" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# rules SIDE DIR FLAGS...: the nat rules SIDE (real or standin) leaves.
rules() {
	side=$1 dir=$2
	shift 2
	if [ "$side" = real ]; then
		mkdir -p "$dir/u" "$dir/w"
		# The real original logs its first sync ("... rules synced"
		# lines) and sleeps resyncInterval: 10 s is ample for one sync.
		unshare -m -n --propagation private sh -c '
			set -e
			dir=$1 orig=$2; shift 2
			ip link set lo up
			mount -t overlay overlay -o "lowerdir=/etc,upperdir=$dir/u,workdir=$dir/w" /etc
			mkdir -p /etc/config
			[ ! -f "$dir/config" ] || cp "$dir/config" /etc/config/ip-masq-agent
			timeout 10 "$orig" "$@" >"$dir/real.log" 2>&1 || true
			iptables-nft-save -t nat; ip6tables-nft-save -t nat' sh "$dir" "$orig" "$@"
	else
		unshare -m -n --propagation private sh -c '
			set -e
			dir=$1 standin=$2; shift 2
			ip link set lo up
			cfg=$dir/config
			[ -f "$cfg" ] || cfg=$dir/none
			timeout 30 "$standin" -once --config "$cfg" "$@" >"$dir/standin.log" 2>&1 || true
			iptables-nft-save -t nat; ip6tables-nft-save -t nat' sh "$dir" "$standin" "$@"
	fi | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]$//'
}

n=0 bad=0
# Each case: NAME|CONFIG (\n for new lines; "-": no file)|FLAGS
while IFS='|' read -r name config flags; do
	case $name in '' | '#'*) continue ;; esac
	n=$((n + 1))
	dir=$work/$n
	mkdir -p "$dir"
	[ "$config" = - ] || printf '%b' "$config" >"$dir/config"
	# shellcheck disable=SC2086 # the flags are words
	rules real "$dir" $flags >"$dir/real" || true
	# shellcheck disable=SC2086
	rules standin "$dir" $flags >"$dir/standin" || true
	if cmp -s "$dir/real" "$dir/standin"; then
		echo "same: $name ($(grep -c '^-A' "$dir/real") rules)"
	else
		bad=$((bad + 1))
		echo "DIFFERENT: $name"
		diff "$dir/real" "$dir/standin" | sed 's/^/    /' | head -30
		sed 's/^/    real original: /' "$dir/real.log" | tail -5
	fi
done <"$cases"
echo "original-parity: $n cases, $bad different"
[ "$bad" = 0 ]
