// Package xds serves the workload tables to node proxies over Delta ADS
// (docs/wire-contract.md §2): istio.workload.Address and
// istio.security.Authorization, wildcard and on demand, with ACK/NACK
// tracking, reconnects that skip unchanged resources, and proxy status
// (istio.io/debug/syncz, docs/wire-contract.md §8.3). It also serves
// Envoy's types (clusters, endpoints, listeners, routes) from the
// controller/sidecar generators to Envoy sidecars and proxyless gRPC
// clients, over state-of-the-world and Delta ADS (envoy*.go,
// docs/sidecar-xds.md).
//
// It uses go-control-plane's discovery and CSDS types but not its server
// or cache: the cache has no notion of aliases (an on-demand lookup by
// "<network>/<ip>" answered under a workload's UID), of implicit
// subscriptions (every workload on the proxy's node, the workloads of a
// subscribed service), or of per-connection coalescing with a memory
// bound, and its server does not expose the per-type nonces proxy status
// needs. What is here instead:
//
//   - Table: every resource marshalled once into an Any with its version
//     (xxhash64 of the Any) and aliases, shared by all connections.
//   - watch: one connection's subscription to one type, the *Resource
//     last sent for each name, and the names changed since; a response is
//     the difference between the table and what was sent.
//   - Server: the push pipeline (change sets from the index, debounced,
//     applied to the Table, then marked on every connection) and the gRPC
//     streams, each with its own sender so a slow proxy delays nobody.
//     Streams are accepted from the start, but their requests are applied
//     and answered only once the first full table is loaded (Ready): a
//     proxy's first response is never part of the mesh, and a
//     reconnecting proxy's held versions are compared with the whole
//     table.
//   - envoyConn: one Envoy client's stream. Each generation of the mesh
//     builds one Generator, shared by all; what it generates is cached per
//     share (sidecar.Share: keyed by only what its generator reads of the
//     proxy) and taken over by the next generation when what its
//     generation read of the mesh (sidecar.Reads) is unchanged there
//     (DepsOf); in tests every share taken over is generated again and
//     compared; a response is the watch's whole set, sent when it differs
//     from what was sent.
//   - admission: what a stream must pass once its caller is authenticated
//     (from its headers, before any message is read): caps on the streams
//     open in total and per caller, and a budget of new streams per
//     second. Refusals are ResourceExhausted, counted by reason.
package xds
