//go:build !linux

package hbone

import (
	"errors"
	"net"
)

// canReadReady: readReady is not implemented here; Splice copies with a
// goroutine per direction.
const canReadReady = false

func (k *appSink) readReady() (*[]byte, int, error) {
	return nil, 0, errors.New("hbone: readReady: not supported")
}

// awaitPeer does not wait here: the handshake's state is taken at once.
func awaitPeer(net.Conn) error { return nil }
