// Package leader runs what must have a single writer in the cluster (the
// root-certificate ConfigMaps, ServiceEntry VIPs, the webhook caBundle,
// Events) on one controller replica at a time, chosen by a
// coordination.k8s.io Lease through client-go's leaderelection.
//
// Everything else (xDS, the CA, the injection webhook, the informers)
// runs on every replica and is no business of this package: a replica
// that is not the leader serves proxies exactly as the leader does.
//
// Elector.Run campaigns for the Lease and, on each win, calls a function
// with a context that ends when the Lease is lost or Run's context ends.
// It does not return when the Lease is lost: it waits for the function to
// return and campaigns again, so a replica that loses the Lease (an API
// server outage longer than the renew deadline) keeps serving and takes
// the writers back when it wins. On shutdown the function returns first
// and the Lease is released after, so that a rolling restart hands the
// writers over within a retry period instead of a lease duration, and two
// replicas never write at once through this process's doing.
//
// Only cmd/canopy-controller imports it. An Elector is safe for
// concurrent use; Run may be called once.
package leader
