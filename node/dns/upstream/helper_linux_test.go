package upstream

import (
	"fmt"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary the pod process of TestPodConfigNetns
// instead of running tests: the value is the file to show as the pod's
// /etc/resolv.conf.
const helperEnv = "CANOPY_TEST_POD_RESOLV_CONF"

// runHelper returns unless the binary runs as the pod process, which it
// then is until SIGTERM (or five minutes, should the test be gone).
func runHelper() {
	src, ok := os.LookupEnv(helperEnv)
	if !ok {
		return
	}
	if err := podProcess(src); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(0)
}

// podProcess puts src on /etc/resolv.conf in its own mount namespace (it
// was started with CLONE_NEWNS), as a container runtime does, says
// "ready" and waits.
func podProcess(src string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGTERM)
	// Private first: the bind must not propagate to the test's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount(src, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /etc/resolv.conf: %w", src, err)
	}
	fmt.Println("ready")
	select {
	case <-sig:
	case <-time.After(5 * time.Minute):
	}
	return nil
}
