// Package zds holds the Go types of the node-local protocol between the CNI
// agent and the node proxy (proto package istio.workload.zds, generated from
// proto/zds.proto). Never edit the generated code: change proto/ and run
// make proto.
package zds
