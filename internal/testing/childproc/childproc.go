// Package childproc runs a test's helper binaries (the Kubernetes control
// plane, istiod) as child processes with their output in a log file:
// start, wait until ready, read the log's tail for error messages, stop
// with SIGTERM and then SIGKILL.
package childproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is one running child.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{} // closed when the process has exited
	err     error         // the exit error, valid after done
}

// Start starts cmd (its path, arguments, environment and SysProcAttr set
// by the caller) with stdout and stderr appended to logPath.
func Start(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop asks the process to end and kills it if it has not after grace.
func (p *Process) Stop(grace time.Duration) error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	<-p.done
	return nil
}

// LogTail returns the last lines of the process log, for error messages.
func (p *Process) LogTail() string {
	const max = 4096
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// WaitFor polls ready every interval until it returns nil, the process
// exits or ctx ends. The last readiness error goes into the returned error.
func (p *Process) WaitFor(ctx context.Context, interval time.Duration, ready func(context.Context) error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready; log tail:\n%s", p.Name, p.err, p.LogTail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %w); log tail:\n%s", p.Name, ctx.Err(), last, p.LogTail())
		case <-tick.C:
		}
	}
}
