#!/bin/bash
# realrun.sh CASE_DIR [AZURE_FLAGS...]: runs Azure's real binary ($AZURE_BIN)
# with CASE_DIR/config as its /etc/config (a copy of /etc bind-mounted over
# /etc in a new mount namespace), in a new network namespace, until its first
# sync is done (its MASQUERADE rule is in place) or it exits; prints JSON:
# {exits, error, ipv4Return, ipv6Return, ipv6Rules} from iptables-save.
case=$1; shift
exec unshare -mn --propagation private bash -c '
set -e
e=$(mktemp -d); cp -a /etc/. $e/; rm -rf $e/config
if [ -e "$0/config" ]; then cp -a "$0/config" $e/config; fi
mount --bind $e /etc
ip link set lo up
log=$(mktemp)
"$AZURE_BIN" "$@" >$log 2>&1 & pid=$!
for i in $(seq 100); do
  kill -0 $pid 2>/dev/null || break
  iptables-save -t nat 2>/dev/null | grep -q "^-A IP-MASQ-AGENT.*MASQUERADE" && break
  sleep 0.1
done
sleep 0.5 # the IPv6 rules follow the IPv4 ones
exits=false; err=""
if kill -0 $pid 2>/dev/null; then kill $pid; wait $pid || true; else
  exits=true; err=$(grep -m1 "^F" $log | sed -e "s/^[^]]*] //"); fi
d() { grep "^-A IP-MASQ-AGENT" | grep -o -- "-d [^ ]*" | cut -c4- | sort | jq -R . | jq -sc .; }
v4=$(iptables-save -t nat | d); v6=$(ip6tables-save -t nat | d)
v6rules=false; ip6tables-save -t nat | grep -q "^-A IP-MASQ-AGENT" && v6rules=true
jq -n --argjson exits $exits --arg error "$err" --argjson v4 "$v4" --argjson v6 "$v6" --argjson v6rules $v6rules \
  "{exits: \$exits, error: \$error, ipv4Return: (if \$exits then null else \$v4 end), ipv6Return: (if \$exits or (\$v6rules|not) then null else \$v6 end), ipv6Rules: (\$v6rules and (\$exits|not))}"
rm -rf $e $log
' "$case" "$@"
