// Package ambient computes Canopy's workload discovery tables from Kubernetes
// objects: pure builders, Kubernetes objects in and workloadapi protos out,
// with no I/O and no shared state, filled exactly as docs/wire-contract.md
// §7 and §1.8 describe.
//
// Builders never modify their inputs (they are informer objects) and return
// new protos; a published proto is never modified again. Everything here is
// safe for concurrent use.
package ambient
