// Package metrics is the agent's small HTTP endpoint: Prometheus metrics on
// /metrics, liveness on /healthz and readiness on /readyz. It serves nothing
// else (no pprof, no config dump); any other path is 404 and any method
// other than GET or HEAD is 405.
//
// The agent's loop records what happens through an *Agent (SyncDone,
// SyncFailed, ConfigLoaded, ConfigApplied, SetElements, Repaired), and main
// serves Agent.Handler with Serve on --http-address (default 127.0.0.1:9753,
// the node's loopback, where the DaemonSet's probes reach it with
// hostNetwork; main refuses an empty address, which Serve would take as
// "no endpoint", since the probes need it).
//
// # Metrics
//
// All of the agent's own metrics are named ip_masq_agent_*. They live in a
// private registry together with the standard go_* and process_*
// collectors, and promhttp_metric_handler_errors_total.
//
//	ip_masq_agent_build_info{version}                                   gauge      always 1
//	ip_masq_agent_syncs_total{result}                                   counter    result: success, error
//	ip_masq_agent_sync_duration_seconds                                 histogram  every sync, 100µs .. 5s buckets
//	ip_masq_agent_last_successful_sync_timestamp_seconds                gauge      Unix time; 0 before the first success
//	ip_masq_agent_config_loads_total{result}                            counter    result: success, error, missing
//	ip_masq_agent_config_last_reload_successful                         gauge      1 after success or missing, 0 after error
//	ip_masq_agent_config_last_reload_success_timestamp_seconds          gauge      Unix time of the last good load
//	ip_masq_agent_config_info{hash}                                     gauge      always 1; the hash of the config in force
//	ip_masq_agent_cidrs{set,family,kind}                                gauge      CIDRs in a set; kind: masquerade, nonmasquerade
//	ip_masq_agent_intervals{set,family,kind}                            gauge      intervals in the kernel set after merging
//	ip_masq_agent_repairs_total{what}                                   counter    what: table-deleted, chain-changed, set-changed, other
//	ip_masq_agent_rule_packets_total{family,decision,reason}            counter    read from the kernel's rule counters at scrape time
//	ip_masq_agent_rule_bytes_total{family,decision,reason}              counter    read from the kernel's rule counters at scrape time
//	ip_masq_agent_rule_counters_read_errors_total                       counter    scrapes whose kernel read failed
//
// The rule counters' labels: family is ipv4 or ipv6; decision is masquerade
// or nonmasquerade (left alone), the same words as the kind of the cidrs and
// intervals gauges; reason is cidrs (a CIDR of the decision's list) or
// outbound (no list matched). They are read through the readCounters
// func given to New, once per scrape and never concurrently with itself. If
// it fails, that scrape has no rule_packets/rule_bytes series (Prometheus
// marks them stale rather than reporting a wrong value), the read-error
// counter goes up, and the rest of the scrape is served as usual.
//
// The labelled counters are created at 0 for the known label values, so
// that rate() and increase() see the first increment.
//
// # Health
//
// /readyz is 200 "ok" once a sync has succeeded (the first good config is in
// the kernel) and stays 200 from then on: the rules stay in force whatever
// happens later, and a DaemonSet's readiness only paces its rollout.
// Before that it is 503 "no config applied yet".
//
// /healthz (liveness) is, in this order:
//   - 503 "last sync failed: <reason>" when the last sync failed (SyncFailed,
//     or SyncDone with a result other than success), until a sync succeeds;
//   - before any sync result (start-up grace): 200 "ok: starting", unless no
//     sync has completed for longer than the stale threshold since New:
//     then 503 "no sync completed in <d> since start";
//   - 503 "last successful sync <age> ago (stale after <d>)" when the last
//     success is older than the stale threshold (SetStaleAfter; the agent
//     sets 3 x its resync interval; 0, the default, never goes stale);
//   - 200 "ok" otherwise.
//
// A bad config (ConfigLoaded("error")) does not touch health: the agent keeps
// the rules it had in force and goes on syncing them, and restarting the pod
// (which is what a failing liveness probe does) cannot fix a ConfigMap. A bad
// ConfigMap rolled out to every node must not restart every agent; it shows
// as ip_masq_agent_config_loads_total{result="error"} and in the logs. Only
// the kernel state failing to sync, or syncs stopping, makes /healthz fail.
//
// Every health body is one line of text/plain; charset=utf-8.
package metrics
