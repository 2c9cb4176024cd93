package upstream

import (
	"errors"
	"fmt"
)

// ErrNoProcess is a network namespace in which no process was found. This
// and every other error of PodConfig mean the same to the caller: it uses
// the node proxy's own resolv.conf instead, as ztunnel does for every pod.
var ErrNoProcess = errors.New("no process in the network namespace")

// NetNSID names a network namespace by the device and inode of its nsfs
// file, which stay the same through every path and handle to it.
type NetNSID struct {
	Dev, Ino uint64
}

func (id NetNSID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// maxCandidates bounds how many processes of one namespace PodConfigByID
// tries: a pod's sandbox process has no resolv.conf, its containers share
// one, and a pod with thousands of processes must not cost thousands of
// opens.
const maxCandidates = 16
