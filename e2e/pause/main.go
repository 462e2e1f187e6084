// Command pause is the e2e cluster's pod sandbox ("pause") image: no image
// can be pulled here, so containerd's sandbox_image points at an image built
// from this static binary on scratch. It waits for SIGTERM or SIGINT and, as
// PID 1 of a pod's shared PID namespace would have to, reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
