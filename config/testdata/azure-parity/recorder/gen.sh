#!/bin/bash
# Makes the parity corpus's directories (config/testdata/azure-parity/NAME/config)
# and records Azure's decisions for each (NAME/expected.json).
set -e
C=${1:?the corpus directory (config/testdata/azure-parity)}
REC=${REC:?the recorder binary (README.md)}
BIN=${AZURE_BIN:?Azure's ip-masq-agent-v2 binary (README.md)}
RUN=${REALRUN:-$(dirname "$0")/realrun.sh}
mk() { # mk NAME FILE CONTENT
  mkdir -p "$C/$1/config"; printf '%b' "$3" > "$C/$1/config/$2"; }
flags() { printf '%s\n' "$2" > "$C/$1/flags"; }
cidrs() { # n CIDRs 10.i.0.0/16 starting at $2
  local s="nonMasqueradeCIDRs:\n"; for i in $(seq $2 $(($2+$1-1))); do s+="  - 10.$i.0.0/16\n"; done; printf '%s' "$s"; }
mkdir -p "$C"; find "$C" -mindepth 1 -maxdepth 1 -type d ! -name recorder -exec rm -rf {} +
# common merges
mk disjoint ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
mk disjoint ip-masq-b 'nonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk overlapping ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12]\n'
mk overlapping ip-masq-b 'nonMasqueradeCIDRs: [10.0.0.0/8, 10.1.0.0/16]\n'
mk linklocal-or ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: true\n'
mk linklocal-or ip-masq-b 'masqLinkLocal: false\nnonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk unknown-key ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\nfoo: bar\n'
mk limit-64 ip-masq-a "$(cidrs 64 0)"
mk limit-64-twice ip-masq-a "$(cidrs 64 0)"
mk limit-64-twice ip-masq-b "$(cidrs 64 100)"
mk not-ip-masq ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
mk not-ip-masq config 'nonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk not-ip-masq .ip-masq-hidden 'nonMasqueradeCIDRs: [172.16.0.0/12]\n'
mkdir -p "$C/kubelet-data/config/..2026_01_01_00_00_00.1"
printf 'nonMasqueradeCIDRs: [10.0.0.0/8]\n' > "$C/kubelet-data/config/..2026_01_01_00_00_00.1/ip-masq-agent"
printf 'nonMasqueradeCIDRs: [100.64.0.0/10]\nmasqLinkLocal: true\n' > "$C/kubelet-data/config/..2026_01_01_00_00_00.1/ip-masq-agent-reconciled"
ln -s ..2026_01_01_00_00_00.1 "$C/kubelet-data/config/..data"
ln -s ..data/ip-masq-agent "$C/kubelet-data/config/ip-masq-agent"
ln -s ..data/ip-masq-agent-reconciled "$C/kubelet-data/config/ip-masq-agent-reconciled"
mk ipv6 ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8, "fd00::/8"]\n'
mk ipv6 ip-masq-b 'masqLinkLocalIPv6: true\n'
flags ipv6 --enable-ipv6
mk ipv6-v4-only ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
flags ipv6-v4-only --enable-ipv6
mk ipv6-not-enabled ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8, "fd00::/8"]\n'
mk no-files README 'not a config\n'
mk no-files-reserved README 'not a config\n'
flags no-files-reserved --nomasq-all-reserved-ranges
mk reserved-flag-with-file ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
flags reserved-flag-with-file --nomasq-all-reserved-ranges
mk json ip-masq-a '{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "masqLinkLocal": true}\n'
mk key-case ip-masq-a 'NonMasqueradeCIDRs: [10.0.0.0/8]\nMASQLINKLOCAL: true\n'
mk yaml-yes ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: yes\n'
mk null-list ip-masq-a 'nonMasqueradeCIDRs: null\n'
mk null-list ip-masq-b 'nonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk empty-plus-file ip-masq-a ''
mk empty-plus-file ip-masq-b 'nonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk duplicates ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/8]\n'
mk duplicates ip-masq-b 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
mk octal-length ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/010]\n'
mk multi-doc ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n---\nnonMasqueradeCIDRs: [192.168.0.0/16]\n'
# the differences the issue found
mk empty-file ip-masq-agent ''
mk empty-file-reserved ip-masq-agent ''
flags empty-file-reserved --nomasq-all-reserved-ranges
mk only-linklocal ip-masq-agent 'masqLinkLocal: true\n'
mk only-linklocal-ipv6 ip-masq-agent 'masqLinkLocalIPv6: true\n'
flags only-linklocal-ipv6 --enable-ipv6
mk only-resync ip-masq-agent 'resyncInterval: 30s\n'
mk empty-list ip-masq-agent 'nonMasqueradeCIDRs: []\n'
mk comment-only ip-masq-agent '# nothing here\n'
mk resync-soon ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: soon\n'
mk resync-bare ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 90\n'
mk resync-null ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: null\n'
mk cidrlimit-100-65 ip-masq-agent "cidrLimit: 100\n$(cidrs 65 0)"
mk cidrlimit-1-2 ip-masq-agent 'cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n'
mk cidrlimit-bad ip-masq-agent 'cidrLimit: many\nnonMasqueradeCIDRs: [10.0.0.0/8]\n'
mk masquerade-cidrs ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.1.0.0/16]\n'
mk masq-outbound ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqOutBound: false\nmasqOutBoundIPv6: false\n'
mk masq-outbound-bad ip-masq-agent 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqOutBound: maybe\n'
mk ipv4-mapped ip-masq-agent 'nonMasqueradeCIDRs: ["::ffff:10.0.0.0/104"]\n'
mk source-extension ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
mk source-extension ip-masq-b 'nonMasqueradeSourceCIDRs: [10.244.1.0/24]\n'
mk null-item ip-masq-agent 'nonMasqueradeCIDRs: [null, 192.168.0.0/16]\n'
mk bad-file ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/33]\n'
mk bad-file ip-masq-b 'nonMasqueradeCIDRs: [192.168.0.0/16]\n'
mk bad-bool ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: "true"\n'
mk dangling-link ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
ln -s ..data/ip-masq-gone "$C/dangling-link/config/ip-masq-b"
mk subdirectory ip-masq-a 'nonMasqueradeCIDRs: [10.0.0.0/8]\n'
mkdir -p "$C/subdirectory/config/ip-masq-sub"
printf 'nonMasqueradeCIDRs: [192.168.0.0/16]\n' > "$C/subdirectory/config/ip-masq-sub/ip-masq-agent"
mkdir -p "$C/missing-directory"
# record: Azure's syncConfig (the recorder: its merged config) and Azure's
# binary (realrun.sh: its exit and the rules iptables-save shows)
tmp=$(mktemp)
for d in "$C"/*/; do
  n=$(basename "$d"); [ "$n" = recorder ] && continue; f=""; [ -f "$d/flags" ] && f=$(cat "$d/flags")
  AZURE_DIR="${d%/}/config" AZURE_OUT="$tmp" $REC -test.run '^TestRecord$' $f >/dev/null
  AZURE_BIN=$BIN $RUN "${d%/}" $f | jq -s --slurpfile m "$tmp" \
    '.[0] + {merged: ($m[0] | {exits, error, nonMasqueradeCIDRs, masqLinkLocal, masqLinkLocalIPv6})}' > "${d%/}/expected.json"
done
rm -f "$tmp"
