// Package security holds the Go types of Canopy's workload authorization
// protocol (proto package istio.security, generated from
// proto/authorization.proto): the L4 policies node proxies enforce. Never edit
// the generated code: change proto/ and run make proto.
package security
