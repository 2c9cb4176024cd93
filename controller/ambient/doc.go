// Package ambient computes Canopy's workload discovery tables from
// Kubernetes objects: pure builders, Kubernetes objects in and
// workloadapi protos out, with no I/O and no shared state, exactly as the
// wire contract (spec §7 and §1.8) says istiod fills them.
//
// Builders never modify their inputs (they are informer objects) and return
// new protos; a published proto is never modified again. Everything here is
// safe for concurrent use.
package ambient
