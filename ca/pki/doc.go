// Package pki is the pure core of Canopy's certificate authority: the root
// (or plug-in intermediate) key and certificates, CSR validation, and
// signing workload certificates whose only identity is the SPIFFE URI the
// CA decided, never one taken from the CSR. No I/O: the caller stores and
// loads the PEM (Secret istio-ca-secret, or cacerts for a plug-in CA).
//
// An Authority is immutable after creation and safe for concurrent use.
package pki
