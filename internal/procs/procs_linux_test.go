package procs

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestLookupStopAndReuse(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p, err := Lookup(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() {
		t.Fatal("fresh process not alive")
	}
	// Another start time names another process: never touched.
	other := Process{PID: p.PID, StartTime: p.StartTime + 1}
	if other.Alive() {
		t.Error("a process with a different start time counts as alive")
	}
	other.Kill()
	if !p.Alive() {
		t.Fatal("Kill of a mismatched start time killed the process")
	}
	p.Stop(5 * time.Second)
	<-done
	if p.Alive() {
		t.Error("process alive after Stop")
	}
	if _, err := Lookup(os.Getpid()); err != nil {
		t.Errorf("Lookup(self): %v", err)
	}
}
