package workloadapi

import (
	"fmt"
	"strings"
)

// ServiceKey returns "<namespace>/<hostname>", the xDS primary name of a
// Service and the key of Workload.services.
func ServiceKey(namespace, hostname string) string {
	return namespace + "/" + hostname
}

// ParseServiceKey splits a "<namespace>/<hostname>" key. The namespace must be
// a Kubernetes namespace name; the hostname must be non-empty and free of "/"
// and whitespace (a wildcard such as "*.example.com" is allowed).
//
// A name that fails here is not a service: for example a removed xDS resource
// name that is neither a known workload UID nor a service key.
func ParseServiceKey(key string) (namespace, hostname string, err error) {
	namespace, hostname, ok := strings.Cut(key, "/")
	switch {
	case !ok:
		err = fmt.Errorf("want <namespace>/<hostname>")
	case !isDNSLabel(namespace):
		err = fmt.Errorf("namespace %q is not a valid namespace name", namespace)
	case hostname == "":
		err = fmt.Errorf("empty hostname")
	case len(hostname) > 253:
		err = fmt.Errorf("hostname longer than 253 characters")
	case strings.ContainsFunc(hostname, func(r rune) bool { return r == '/' || r <= ' ' || r == 0x7f }):
		err = fmt.Errorf("hostname %q contains %q, a space or a control character", hostname, "/")
	}
	if err != nil {
		return "", "", fmt.Errorf("%w: service key %q: %w", ErrMalformedName, key, err)
	}
	return namespace, hostname, nil
}

// isDNSLabel reports whether s is an RFC 1123 label, the form of Kubernetes
// namespace names: 1 to 63 lower-case letters, digits and '-', starting and
// ending with a letter or digit.
func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}
