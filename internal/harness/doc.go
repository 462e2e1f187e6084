// Package harness is what the kernel tests (test/) and the benchmarks
// (bench/) share to run the agent as a daemon: the process with its log
// (each write timed), waits on that log that end when the agent exits,
// a ConfigMap volume updated as the kubelet updates it, the health
// endpoints polled, and the polling wait of a test.
//
// Waits on the log are woken by the agent's writes, not by a clock, so a
// benchmark's times come from the events themselves (a log write, a
// kernel notification) and never from the poll of a loop.
package harness
