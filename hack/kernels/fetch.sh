#!/bin/sh
# fetch.sh KERNEL CACHE: makes sure CACHE/KERNEL/ holds the Debian kernel
# package's vmlinuz and modules (depmod run), and prints the directory.
# KERNEL is 5.10 (bullseye), 6.1 or 6.12 (bookworm). The newest package of
# that series is taken from an apt configuration of the harness's own
# (sources, lists and cache under CACHE/apt/): the suites the machine's apt
# already uses, and their bullseye counterparts; the machine's own sources
# and lists stay untouched. Fails naming the package when it cannot be
# fetched: its last line on stderr is "fetch.sh: cannot fetch kernel
# KERNEL (PACKAGE): WHY" (run.sh puts it in its summary), also when a
# command fails under set -e (dpkg-deb, depmod, ...).
set -eu
k=$1
pkg= step="prepare the cache"
# die WHY: the error line, naming the package (the pattern until one is
# chosen).
die() {
	echo "fetch.sh: cannot fetch kernel $k (${pkg:-${name:-?}}): $*" >&2
	died=1
	exit 1
}
trap 'rc=$?; [ "$rc" = 0 ] || [ -n "${died:-}" ] || echo "fetch.sh: cannot fetch kernel $k (${pkg:-${name:-?}}): $step failed (exit $rc)" >&2' EXIT
mkdir -p "$2"
cache=$(cd "$2" && pwd)
case $k in
5.10) pattern='^linux-image-5\.10\.0-[0-9]+-amd64-unsigned$' name='linux-image-5.10.0-*-amd64-unsigned (bullseye)' ;;
6.1) pattern='^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' name='linux-image-6.1.0-*-amd64-unsigned (bookworm)' ;;
6.12) pattern='^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' name='linux-image-6.12.*+deb12-amd64-unsigned (bookworm)' ;;
*) echo "fetch.sh: unknown kernel $k (5.10, 6.1 or 6.12)" >&2; died=1; exit 2 ;;
esac
dir=$cache/$k
if [ -f "$dir/vmlinuz" ] && [ -f "$dir/version" ]; then
	echo "$dir"
	exit 0
fi

apt=$cache/apt
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$dir"
# The mirrors the machine's apt uses for Debian (bookworm, -updates,
# -security), and the same suites of bullseye.
if [ ! -s "$apt/sources.list" ]; then
	apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null | sort -u |
		while read -r uri rel; do
			case $rel in bookworm*) ;; *) continue ;; esac
			echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $rel main"
			echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $(echo "$rel" | sed 's/bookworm/bullseye/') main"
		done >"$apt/sources.list.new"
	if [ ! -s "$apt/sources.list.new" ]; then
		die "the machine's apt has no Debian bookworm source to take the mirror from"
	fi
	mv "$apt/sources.list.new" "$apt/sources.list"
fi
aptq() {
	apt-get -q -o Dir::Etc::sourcelist="$apt/sources.list" -o Dir::Etc::sourceparts="$apt/sources.list.d" \
		-o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" \
		-o Dir::State::status=/dev/null -o APT::Get::List-Cleanup=0 "$@"
}
cacheq() {
	apt-cache -o Dir::Etc::sourcelist="$apt/sources.list" -o Dir::Etc::sourceparts="$apt/sources.list.d" \
		-o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Dir::State::status=/dev/null "$@"
}
# Lists older than a day are fetched again (a kernel package is replaced by
# its next ABI, and the old one leaves the mirror).
if [ -z "$(find "$apt/lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
	aptq update -qq >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; die "apt-get update with the harness's sources ($apt/sources.list) failed"; }
fi
step="choose the package"
pkg=$(cacheq pkgnames linux-image- | grep -E "$pattern" | sort -V | tail -1)
if [ -z "$pkg" ]; then
	die "no such package in the sources of $apt/sources.list"
fi
if ! cacheq show "$pkg" 2>/dev/null | grep -q '^Filename:.*linux-image'; then
	die "the package has no package file"
fi
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
(cd "$dir.tmp" && aptq download "$pkg" >download.log 2>&1) || {
	cat "$dir.tmp/download.log" >&2
	die "apt-get download failed"
}
step="find the downloaded .deb"
deb=$(ls "$dir.tmp"/*.deb | head -1)
step="dpkg-deb -x of the package"
dpkg-deb -x "$deb" "$dir.tmp/root"
ver=$(ls "$dir.tmp/root/lib/modules" | head -1)
if [ -z "$ver" ] || [ ! -f "$dir.tmp/root/boot/vmlinuz-$ver" ]; then
	die "the package holds no kernel and modules (a meta package?)"
fi
step="depmod of its modules"
depmod -b "$dir.tmp/root" "$ver"
step="move it into the cache"
rm -f "$deb"
echo "$pkg" >"$dir.tmp/package"
echo "$ver" >"$dir.tmp/version"
cp "$dir.tmp/root/boot/vmlinuz-$ver" "$dir.tmp/vmlinuz"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"
