//go:build !linux

package upstream

import (
	"errors"
	"fmt"
	"os"
)

// NetNSIDOf returns the identity of the network namespace f refers to;
// network namespaces exist only on Linux.
func NetNSIDOf(_ *os.File) (NetNSID, error) {
	return NetNSID{}, fmt.Errorf("network namespace identity: %w", errors.ErrUnsupported)
}

// PodConfig reads the resolv.conf of a pod; network namespaces exist only
// on Linux.
func PodConfig(_ string, _ *os.File) (Config, error) {
	return Config{}, fmt.Errorf("read pod resolv.conf: %w", errors.ErrUnsupported)
}

// PodConfigByID reads the resolv.conf of a pod; network namespaces exist
// only on Linux.
func PodConfigByID(_ string, _ NetNSID) (Config, error) {
	return Config{}, fmt.Errorf("read pod resolv.conf: %w", errors.ErrUnsupported)
}
