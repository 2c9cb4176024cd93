package hbone

import (
	"errors"
	"fmt"

	"golang.org/x/net/http2"
)

// Errors of a stream or a connection.
var (
	ErrReset      = errors.New("hbone: stream reset by peer")
	ErrConnClosed = errors.New("hbone: connection closed")
	ErrGoAway     = errors.New("hbone: connection going away")
	// ErrEnhanceYourCalm ends a connection whose peer exceeded one of
	// its Limits; the peer was sent GOAWAY with ENHANCE_YOUR_CALM. The
	// errors of the individual limits wrap it.
	ErrEnhanceYourCalm = errors.New("hbone: peer exceeded a limit")
	// ErrFlood is a peer sending control frames faster than Limits allow
	// or than it reads their answers.
	ErrFlood = fmt.Errorf("%w: frame flood", ErrEnhanceYourCalm)
	// ErrTooManyResets is a peer resetting streams (or having them
	// refused or reset) faster than Limits.Resets allow, the rapid reset
	// attack (CVE-2023-44487).
	ErrTooManyResets = fmt.Errorf("%w: too many stream resets", ErrEnhanceYourCalm)
	// ErrProtocol ends a connection whose peer broke HTTP/2; the peer
	// was sent GOAWAY with PROTOCOL_ERROR (or the error's own code).
	ErrProtocol = errors.New("hbone: HTTP/2 protocol error")
	// ErrHandshakeTimeout is a peer that did not start HTTP/2 (preface,
	// SETTINGS) within Limits.HandshakeTimeout.
	ErrHandshakeTimeout = errors.New("hbone: no HTTP/2 preface and SETTINGS in time")
)

// errFlowControl is a peer sending past a window we gave it.
var errFlowControl = errors.New("hbone: peer exceeded a flow-control window")

// goAwayCode is the GOAWAY error code telling the peer why a connection
// ends with err.
func goAwayCode(err error) http2.ErrCode {
	var ce http2.ConnectionError
	switch {
	case errors.Is(err, ErrEnhanceYourCalm):
		return http2.ErrCodeEnhanceYourCalm
	case errors.Is(err, errFlowControl):
		return http2.ErrCodeFlowControl
	case errors.As(err, &ce):
		return http2.ErrCode(ce)
	case errors.Is(err, ErrConnClosed):
		return http2.ErrCodeNo
	}
	return http2.ErrCodeProtocol
}
