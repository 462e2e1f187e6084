#!/bin/sh
# run.sh [KERNEL...]: `make test-kernels`. Runs the kernel tests (test/,
# built with `go test -c`) and the smoke test (TestKernelSmoke) on each
# KERNEL: 5.10, 6.1 and 6.12 (Debian's packages, fetched by fetch.sh and
# cached in .cache/kernels/) each in its own qemu guest (TCG; one at a time
# unless KERNEL_JOBS says more),
# and "host", the running kernel, directly. Prints one summary line per
# kernel and records them in docs/kernels.tsv (see docs/kernels.md).
#
# Environment: KERNEL_TESTS, KERNEL_SKIP: regexps of the tests to run and
# to leave out (default: every test in test/ but the container and
# manifest tests, which need no particular kernel, TestBusyNode, which
# puts the agent under a CPU quota that a TCG guest's emulated CPU, 5-50x
# slower, makes meaningless, and TestHostileConfigs, whose parsing of
# megabyte configs outlasts its waits there (5.10: a 2 MB list's outcome
# not logged within 60 s), and TestReleaseBuildInfo, which builds the
# agent with the Go toolchain (none in the guests, nor in guest.sh's PATH):
# make test runs them on the host's kernel);
# KERNEL_TIMEOUT: the
# go test timeout per kernel (default 90m); KERNEL_VM_TIMEOUT: the guest's
# (default 3h); KERNEL_SMP (2), KERNEL_MEM
# (2G); KERNEL_JOBS: guests at once (1); KERNEL_BIN: where the binaries
# for the guests are built (bin/kernels; another for a second run at the
# same time); RECORD=0: do not write
# docs/kernels.tsv.
set -eu
cd "$(dirname "$0")/../.."
repo=$(pwd)
GO=${GO:-go}
cache=$repo/.cache/kernels
kernels=${*:-5.10 6.1 6.12 host}
tests=${KERNEL_TESTS:-.}
skip=${KERNEL_SKIP-'^(TestContainer|TestManifests|TestBusyNode|TestHostileConfigs|TestReleaseBuildInfo)'}
timeout=${KERNEL_TIMEOUT:-90m}
bin=${KERNEL_BIN:-$repo/bin/kernels}

for c in qemu-system-x86_64 busybox cpio depmod modprobe xz dpkg-deb apt-get; do
	if ! command -v "$c" >/dev/null 2>&1; then
		echo "make test-kernels: $c is missing (make deps-kernels installs it)" >&2
		exit 1
	fi
done
if [ "$(id -u)" != 0 ]; then
	echo "make test-kernels: needs root (guests mount the host's root; the tests create namespaces)" >&2
	exit 1
fi

mkdir -p "$bin" "$cache/out"
# The code measured: the commit, "+changes" when the tree differs from it.
code=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!docs/kernels.tsv' ':!docs/kernels.md' 2>/dev/null || code="$code+changes"
CGO_ENABLED=0 $GO build -trimpath -o "$bin/ip-masq-agent" ./cmd/ip-masq-agent
CGO_ENABLED=0 $GO test -c -o "$bin/test.test" ./test/
# nft/kernel's own kernel tests (the fence, the read-backs, the monitor's
# touches, the wire), all of them, after test/'s (KERNEL_PKG=0: not).
CGO_ENABLED=0 $GO test -c -o "$bin/kernel.test" ./nft/kernel/
# The stand-in original agent that the iptables tests run (a module of its
# own, e2e/): the guests have no Go toolchain to build it.
(cd e2e && GOWORK=off CGO_ENABLED=0 $GO build -trimpath -o "$bin/original" ./original)

# secs: seconds since the epoch.
secs() { date +%s; }

summary=$cache/out/summary
: >"$summary"

# one K: boots K's guest (or runs on the host's kernel) and leaves in
# $cache/out/K its output, its status (status: 0 or 1) and, for the
# table, its row (row).
one() {
	k=$1
	out=$cache/out/$k
	rm -rf "$out" && mkdir -p "$out"
	cat >"$out/env" <<EOT
REPO='$repo'
BIN='$bin'
TESTS='$tests'
SKIP='$skip'
TIMEOUT='$timeout'
KERNEL_PKG='${KERNEL_PKG:-1}'
EOT
	start=$(secs)
	pkg=- series=$k
	if [ "$k" = host ]; then
		series=$(uname -r | cut -d. -f1,2)
		sh hack/kernels/guest.sh "$out"
	else
		# fetch.sh names the package (or the pattern it looked for) in its
		# last line on stderr: the summary repeats it.
		kdir=$(sh hack/kernels/fetch.sh "$k" "$cache" 2>"$out/fetch.err") || {
			cat "$out/fetch.err" >&2
			why=$(sed -n 's/^fetch\.sh: cannot fetch kernel [^ ]* (\(.*\)): \(.*\)$/\1: \2/p' "$out/fetch.err" | tail -1)
			[ -n "$why" ] || why=$(grep 'fetch\.sh:' "$out/fetch.err" | tail -1 | sed 's/^fetch\.sh: //')
			echo "kernel $k: cannot fetch ${why:-it: fetch.sh failed without a reason (see above)}" | tee -a "$summary"
			echo 1 >"$out/status"
			return
		}
		cat "$out/fetch.err" >&2
		ver=$(cat "$kdir/version") pkg=$(cat "$kdir/package")
		# The initramfs: busybox, and the modules that mount 9p over
		# virtio, in the order modprobe would load them (decompressed:
		# busybox's insmod reads plain .ko).
		ird=$out/initramfs
		mkdir -p "$ird/bin" "$ird/mods" "$ird/proc" "$ird/sys" "$ird/dev" "$ird/newroot"
		cp "$(command -v busybox)" "$ird/bin/busybox"
		cp hack/kernels/init "$ird/init"
		printf "VER='%s'\nREPO='%s'\nOUT='%s'\n" "$ver" "$repo" "$out" >"$ird/env"
		: >"$ird/modules.order"
		for m in virtio_pci 9pnet_virtio 9p; do
			modprobe -d "$kdir/root" -S "$ver" --show-depends "$m" | sed -n 's/^insmod \([^ ]*\).*/\1/p'
		done | awk '!seen[$0]++' | while read -r f; do
			b=$(basename "$f")
			case $b in
			*.xz) xz -dc "$f" >"$ird/mods/${b%.xz}"; b=${b%.xz} ;;
			*.zst) zstd -qdc "$f" >"$ird/mods/${b%.zst}"; b=${b%.zst} ;;
			*) cp "$f" "$ird/mods/$b" ;;
			esac
			echo "$b" >>"$ird/modules.order"
		done
		(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.gz"
		rm -rf "$ird"
		# TCG (KVM guests hang on this kind of machine). The console goes to console.log.
		timeout "${KERNEL_VM_TIMEOUT:-3h}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "${KERNEL_MEM:-2G}" -smp "${KERNEL_SMP:-2}" \
			-display none -monitor none -serial "file:$out/console.log" -no-reboot \
			-kernel "$kdir/vmlinuz" -initrd "$out/initramfs.gz" -append "console=ttyS0 panic=-1 quiet" \
			-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
			-virtfs "local,path=$kdir/root/lib/modules/$ver,mount_tag=mods,security_model=none,readonly=on" \
			-virtfs "local,path=$repo,mount_tag=work,security_model=none,multidevs=remap" </dev/null || true
	fi
	took=$(($(secs) - start))
	uname=$(cat "$out/uname" 2>/dev/null || echo "?")
	if [ ! -f "$out/test.rc" ]; then
		# A guest that stopped mid-run (its kernel's oops, the VM's
		# timeout) says in which test, after how many, and the oops.
		last=$(sed -n 's/^=== RUN *\([^ /]*\).*/\1/p' "$out/test.out" 2>/dev/null | tail -1)
		passed=$(grep -c '^--- PASS' "$out/test.out" 2>/dev/null || true)
		oops=$(grep -m1 -E 'Oops:|BUG:|Kernel panic' "$out/console.log" 2>/dev/null | sed 's/^\[[ 0-9.]*\] //' || true)
		if [ -n "$last" ]; then
			echo "kernel $series ($uname): the guest stopped during $last, after ${passed:-0} passed${oops:+ (console: $oops)} (see $out/console.log)" | tee -a "$summary"
		else
			echo "kernel $series ($uname): the tests did not run (see $out/console.log)" | tee -a "$summary"
		fi
		tail -20 "$out/console.log" 2>/dev/null >&2
		echo 1 >"$out/status"
		return
	fi
	# Top-level tests: subtests are counted with their test, but for the
	# skipped ones (go test -v indents them), counted apart: a test that
	# passes may have skipped some of its subtests.
	passed=$(grep -c '^--- PASS' "$out/test.out" || true)
	failed=$(grep -c '^--- FAIL' "$out/test.out" || true)
	skipped=$(grep -c '^--- SKIP' "$out/test.out" || true)
	subskipped=$(grep -cE '^[[:space:]]+--- SKIP' "$out/test.out" || true)
	mode=$(sed -n 's/.*kernel mode: \([a-z-]*\).*/\1/p' "$out/test.out" | head -1)
	[ -n "$mode" ] || mode="?"
	rc=$(cat "$out/test.rc")
	if [ "$rc" = 0 ]; then echo 0 >"$out/status"; else echo 1 >"$out/status"; fi
	line="kernel $series ($uname): $mode; $passed passed, $failed failed, $skipped skipped, $subskipped subtests skipped (${took}s)"
	echo "$line" | tee -a "$summary"
	if [ "$rc" != 0 ]; then
		grep -E '^\s*--- FAIL|^panic|^FAIL' "$out/test.out" | head -20 >&2
	fi
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$series" "$uname" "$pkg" "$mode" "$passed" "$failed" "$skipped" \
		"$took" "$tests" "${skip:--}" "$(date -u +%Y-%m-%d)" "$code" "$subskipped" >"$out/row"
}

# KERNEL_JOBS=N: N guests at once (default 1). The tests wait for events,
# not for time, so guests that share the host's cores take longer each but
# less in all: their tests spend much of their time waiting.
jobs=${KERNEL_JOBS:-1}
n=0
for k in $kernels; do
	if [ "$jobs" -le 1 ]; then
		one "$k"
	else
		one "$k" &
		n=$((n + 1))
		if [ "$n" -ge "$jobs" ]; then
			wait
			n=0
		fi
	fi
done
wait

status=0
for k in $kernels; do
	out=$cache/out/$k
	[ "$(cat "$out/status" 2>/dev/null)" = 0 ] || status=1
	[ -f "$out/row" ] || continue
	if [ "${RECORD:-1}" = 1 ]; then
		# docs/kernels.tsv: one line per kernel series, the last run's.
		f=docs/kernels.tsv
		series=$(cut -f1 "$out/row")
		[ -f "$f" ] || printf 'series\tkernel\tpackage\tmode\tpassed\tfailed\tskipped\tseconds\ttests\tskip\tdate\tcommit\tsubskipped\n' >"$f"
		# A file from before the subskipped column gets it, "-" (not
		# counted) in its rows.
		awk -F'\t' -v OFS='\t' -v s="$series" 'NR == 1 { sub_ = ($NF == "subskipped"); if (!sub_) $0 = $0 OFS "subskipped"; print; next }
			$1 != s { if (!sub_) $0 = $0 OFS "-"; print }' "$f" >"$f.new"
		cat "$out/row" >>"$f.new"
		mv "$f.new" "$f"
	fi
done
echo "make test-kernels:"
cat "$summary"
if [ "${RECORD:-1}" = 1 ]; then
	$GO run ./hack/kernels/doctable -w
fi
exit $status
