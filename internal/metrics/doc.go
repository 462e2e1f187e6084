// Package metrics is the agent's small HTTP endpoint: Prometheus metrics on
// /metrics, liveness on /healthz and readiness on /readyz. It serves nothing
// else (no pprof, no config dump); any other path is 404 and any method
// other than GET or HEAD is 405.
//
// The agent's loop records what happens through an *Agent (SyncDone,
// Ready, NotReady, Alive, ConfigLoaded, ConfigApplied, SetElements,
// Repaired), and main serves Agent.Handler with Serve on --http-address
// (default 127.0.0.1:9753, the node's loopback, where the DaemonSet's
// probes reach it with hostNetwork; main refuses an empty address, which
// Serve would take as "no endpoint", since the probes need it).
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
//	ip_masq_agent_intervals{set,family,kind}                            gauge      intervals in the kernel set (one per CIDR not inside another; adjacent ones joined on array-lookup kernels)
//	ip_masq_agent_repairs_total{what}                                   counter    what: table-deleted, chain-changed, set-changed, other
//	ip_masq_agent_rival_writer                                          gauge      1 while another process owns or keeps rewriting the table
//	ip_masq_agent_waiting_for_owner                                     gauge      1 while another process owns the table and the agent waits
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
// The two probes mean what the kubelet does with them.
//
// /healthz (liveness: a failure restarts the container) is 200 "ok" while
// the agent's loop turns (Alive, at least every 10 s), and 503 "the
// agent's loop has not turned for <d> (stuck after <d>)" when it has not
// for longer than StuckAfter (2 min; SetStuckAfter). Nothing a restart
// cannot fix fails it: not a bad ConfigMap, not a kernel that refuses a
// change, not another process owning the table. A pod restarted for those
// would come back to the same node and the same answer, in CrashLoopBackOff.
//
// /readyz (readiness: shown as READY in kubectl get pods, paces a rollout)
// is 200 "ok" while the agent last found the kernel holding the config's
// table (Ready), and 503 with the reason otherwise (NotReady): "no config
// applied yet", "last sync failed: <err>", "config <file> not applied: ...",
// "another process owns table inet ip-masq-agent ...; waiting for it to
// exit". The rules already in the kernel stay in force meanwhile.
//
// Every health body is one line of text/plain; charset=utf-8.
package metrics
