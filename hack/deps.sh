#!/bin/sh
# Installs the packages that are missing for `make demo` and `make test`
# (deps.sh test, the default) or, in addition, for `make e2e-cluster`
# (deps.sh e2e) or `make test-kernels` (deps.sh kernels). Quick and quiet when nothing is missing.
#
# As root: apt-get on Debian and Ubuntu (apt-get update once, then install
# without recommends), dnf on Fedora and RHEL-likes, otherwise one line that
# names the packages. Without root: one line that says what to install, and
# exit 0 (without root `make test` runs only the tests that need no
# privileges; the kernel tests skip and say so).
set -eu

what=${1:-test}
GO=${GO:-go}
# nft, ip and sysctl live in /usr/sbin, which a user's PATH may lack.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
export PATH

# One line per command: the command (a|b: either will do), its Debian
# package, its Fedora package. Keep in step with internal/testnet/require.go
# (TestPackagesInDeps checks it). promtool (test/alerts_test.go) has no
# package of its own: on Debian it is taken out of the prometheus package
# (promtool_from_deb), not installed with the server.
test_needs='ip iproute2 iproute
nft nftables nftables
iptables-nft iptables iptables-nft
iptables-nft-restore iptables iptables-nft
iptables-nft-save iptables iptables-nft
ip6tables-nft iptables iptables-nft
ip6tables-nft-restore iptables iptables-nft
iptables-legacy iptables iptables-legacy
iptables-legacy-restore iptables iptables-legacy
ip6tables-legacy iptables iptables-legacy
ip6tables-legacy-restore iptables iptables-legacy
sysctl procps procps-ng
conntrack conntrack conntrack-tools
setpriv util-linux util-linux
unshare util-linux util-linux
grep grep grep
sed sed sed
cat coreutils coreutils
sleep coreutils coreutils
false coreutils coreutils
sh dash bash
make make make
podman podman podman
buildah buildah buildah
runc|crun runc runc
promtool prometheus golang-github-prometheus'
# e2e/cluster/main.go's preflight.
e2e_needs='containerd containerd containerd
ctr containerd containerd
containerd-shim-runc-v2 containerd containerd
runc runc runc
nsenter util-linux util-linux
unshare util-linux util-linux
mount mount util-linux
/usr/lib/cni/bridge containernetworking-plugins containernetworking-plugins
/usr/lib/cni/host-local containernetworking-plugins containernetworking-plugins
/usr/lib/cni/loopback containernetworking-plugins containernetworking-plugins'

# make test-kernels (hack/kernels/run.sh): qemu guests with a busybox
# initramfs, the kernel packages' modules.
kernels_needs='qemu-system-x86_64 qemu-system-x86 qemu-system-x86
busybox busybox-static busybox
cpio cpio cpio
depmod kmod kmod
modprobe kmod kmod
xz xz-utils xz
dpkg-deb dpkg dpkg
timeout coreutils coreutils'

case $what in
test) needs=$test_needs ;;
kernels) needs="$test_needs
$kernels_needs" ;;
e2e) needs="$test_needs
$e2e_needs" ;;
*) echo "usage: $0 [test|e2e|kernels]" >&2; exit 2 ;;
esac

if ! command -v "$GO" >/dev/null 2>&1; then
	echo "make deps: no Go ($GO): install Go $(sed -n 's/^go //p' go.mod 2>/dev/null || echo '(see go.mod)') or later from https://go.dev/dl/" >&2
	exit 1
fi

present() { # present CMD: the command (or one of a|b, or the file) is there
	case $1 in
	/*) [ -x "$1" ] ;;
	*)
		for c in $(echo "$1" | tr '|' ' '); do
			command -v "$c" >/dev/null 2>&1 && return 0
		done
		return 1
		;;
	esac
}

missing_cmds= deb= rpm=
add() { # add WORD LIST: LIST with WORD once
	case " $2 " in *" $1 "*) echo "$2" ;; *) echo "${2:+$2 }$1" ;; esac
}
scan() {
	missing_cmds= deb= rpm=
	while read -r cmd d r; do
		[ -n "$cmd" ] || continue
		present "$cmd" && continue
		missing_cmds=$(add "$cmd" "$missing_cmds")
		deb=$(add "$d" "$deb")
		rpm=$(add "$r" "$rpm")
	done <<EOT
$needs
EOT
}

scan
[ -z "$missing_cmds" ] && exit 0

if [ "$(id -u)" != 0 ]; then
	if command -v dnf >/dev/null 2>&1 && ! command -v apt-get >/dev/null 2>&1; then
		install="dnf install -y $rpm"
	else
		install="apt-get install --no-install-recommends $deb"
	fi
	echo "make deps: missing $missing_cmds; not root, so not installing: run as root \`$install\` (or sudo make deps); without root only the tests that need no privileges run"
	exit 0
fi

# promtool_from_deb: promtool alone, from Debian's prometheus package,
# into /usr/local/bin: installing the package would also install the
# server and, where systemd runs, start it.
promtool_from_deb() {
	tmp=$(mktemp -d)
	if (cd "$tmp" && apt-get download -qq prometheus 2>/dev/null) &&
		dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" &&
		install -m 0755 "$tmp/x/usr/bin/promtool" /usr/local/bin/promtool; then
		rm -rf "$tmp"
		echo "make deps: installed promtool in /usr/local/bin (from Debian's prometheus package, without the server)"
		return 0
	fi
	rm -rf "$tmp"
	return 1
}

if command -v apt-get >/dev/null 2>&1; then
	echo "make deps: installing $deb (for $missing_cmds)"
	export DEBIAN_FRONTEND=noninteractive
	echo "make deps: apt-get update (the package lists; a minute or so on a slow mirror) ..."
	apt-get update -qq
	promtool_deb=
	case " $deb " in *" prometheus "*)
		promtool_deb=1
		deb=$(echo " $deb " | sed 's/ prometheus / /; s/^ *//; s/ *$//')
		;;
	esac
	if [ -n "$deb" ]; then
		echo "make deps: apt-get install $deb (downloading and unpacking) ..."
		apt-get install -y -qq --no-install-recommends $deb
		echo "make deps: installed $deb"
	fi
	if [ -n "$promtool_deb" ]; then
		promtool_from_deb || echo "make deps: could not take promtool from Debian's prometheus package" >&2
	fi
elif command -v dnf >/dev/null 2>&1; then
	echo "make deps: installing $rpm (for $missing_cmds)"
	dnf install -y -q $rpm
else
	echo "make deps: missing $missing_cmds: install them with your package manager (Debian: $deb; Fedora: $rpm)"
	exit 0
fi

scan
if [ -n "$missing_cmds" ]; then
	echo "make deps: still missing after the install: $missing_cmds" >&2
	exit 1
fi
