package testenv

import "runtime"

// spawner starts child processes from one OS thread that stays alive as
// long as the Environment. The kernel sends Pdeathsig when the *thread*
// that forked a child exits, not the process, and Go ends a thread whose
// goroutine exits while locked to it, which netlink and netns helpers do
// by design (a thread left in another namespace must not be reused). A
// component forked from such a thread would be killed mid-test.
type spawner struct {
	reqs chan func()
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for f := range s.reqs {
			f()
		}
	}()
	return s
}

// do runs f on the spawner's thread.
func (s *spawner) do(f func()) {
	done := make(chan struct{})
	s.reqs <- func() { f(); close(done) }
	<-done
}

// close ends the spawner; its children must be stopped first.
func (s *spawner) close() { close(s.reqs) }
