package workloadapi

import "errors"

// ErrMalformedName is wrapped by every parser error of this package, so that
// callers (an xDS server answering a subscription, a CLI flag) can tell bad
// input from other failures with errors.Is.
var ErrMalformedName = errors.New("malformed resource name")
