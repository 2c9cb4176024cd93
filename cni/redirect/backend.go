package redirect

import (
	"fmt"
	"os"
	"strings"
)

// Backend installs in-pod redirection. Every method takes the path of a
// network namespace (/proc/<pid>/ns/net or a pinned one) and is
// idempotent: Enroll twice leaves the state of Enroll once, Unenroll of a
// pod without rules succeeds.
type Backend interface {
	Name() string
	Enroll(netnsPath string, cfg PodConfig) error
	Unenroll(netnsPath string) error
	// Verify compares the kernel's state with what Enroll installs; a
	// *DriftError lists the differences.
	Verify(netnsPath string, cfg PodConfig) error
}

// DriftError is a pod's kernel state differing from its rules.
type DriftError struct {
	Problems []string
}

func (e *DriftError) Error() string {
	return "redirection drifted: " + strings.Join(e.Problems, "; ")
}

func openNetns(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open netns: %w", err)
	}
	return f, nil
}
