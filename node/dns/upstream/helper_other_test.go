//go:build !linux

package upstream

// runHelper returns: the pod process of the namespace test exists only on
// Linux.
func runHelper() {}
