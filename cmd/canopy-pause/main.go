// Command canopy-pause is the sandbox ("pause") container of the local
// cluster's real nodes: the first process of every pod, which holds the
// pod's namespaces and does nothing else. It exits 0 on SIGINT or SIGTERM
// and reaps any child re-parented to it, as Kubernetes' own pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// As PID 1 of a shared PID namespace, orphans land here.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
