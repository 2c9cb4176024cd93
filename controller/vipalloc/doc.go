// Package vipalloc allocates VIPs to ServiceEntries that give none, as
// istiod's IP auto-allocation does (pilot/pkg/controllers/ipallocate), so
// that node proxies can route, and answer DNS for, hosts that have no
// address of their own: one IPv4 address from 240.240.0.0/16 and one IPv6
// address from 2001:2::/48 per host, written to the ServiceEntry's
// status.addresses, which the table builders read
// (docs/wire-contract.md §7.2).
//
// Which entries and hosts qualify is ambient.AutoAllocates and
// ambient.AutoAllocatedHost. The allocation (Allocate) is a pure function
// of the entry and of who else holds each address: a host keeps the
// addresses its status holds unless another entry has a better claim to
// them, and a new address starts at a point hashed from the entry and host
// and takes the first free one after it. It is deterministic, so a replica
// that takes over (canopy-controller runs a Controller only on the replica
// holding its writers' Lease) computes the same status; each write carries
// the resourceVersion it was computed from, so a write from a stale view,
// or a former leader's last one, fails and is retried from a fresh view. Addresses survive restarts
// because they live in status, and the controller reads every status
// before it allocates anything.
package vipalloc
