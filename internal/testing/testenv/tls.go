package testenv

import "crypto/tls"

// insecureTLS is used only to poll /readyz before the API server's
// self-signed certificate exists on disk; no credential is sent over it.
func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true} //nolint:gosec // see above
}
