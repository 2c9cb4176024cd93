package testenv

import (
	"os/exec"

	"github.com/canopy-mesh/canopy/internal/testing/childproc"
)

// process is one component running as a child process, its output in a
// log file.
type process = childproc.Process

func startProcess(name, path, logPath string, detached bool, args ...string) (*process, error) {
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = sysProcAttr(detached)
	return childproc.Start(name, cmd, logPath)
}
