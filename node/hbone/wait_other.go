//go:build !linux

package hbone

import "errors"

// canWaitReadable: waitReadable is not implemented here; Splice copies
// with a goroutine per direction.
const canWaitReadable = false

func (k *appSink) waitReadable() error { return errors.New("hbone: waitReadable: not supported") }
