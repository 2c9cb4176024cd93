package view

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"

	"github.com/canopy-mesh/canopy/node/configdump"
)

// benchDump is a config_dump of n pods in 100 namespaces on 50 nodes, as
// canopyctl receives it.
func benchDump(b *testing.B, n int) []byte {
	b.Helper()
	d := configdump.Dump{}
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i%100)
		d.Workloads = append(d.Workloads, configdump.Workload{
			UID: fmt.Sprintf("Kubernetes//Pod/%s/pod-%d", ns, i), Name: fmt.Sprintf("pod-%d", i), Namespace: ns,
			Node: fmt.Sprintf("node-%d", i%50), Protocol: "HBONE", WorkloadIPs: []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)},
			ServiceAccount: "default", TrustDomain: "cluster.local", WorkloadType: "pod", Status: "Healthy",
		})
	}
	out, err := json.Marshal(d)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkWorkloads10k is canopyctl workloads' own work for 10,000 pods
// (decode, filter, sort, print); BenchmarkDecodeOnly10k is the baseline:
// decoding the same config_dump and nothing else.
func BenchmarkWorkloads10k(b *testing.B) {
	raw := benchDump(b, 10000)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		var d configdump.Dump
		if err := json.Unmarshal(raw, &d); err != nil {
			b.Fatal(err)
		}
		if err := WorkloadsTable(FilterWorkloads(d.Workloads, WorkloadFilter{}), d.Services, nil, false).Print(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeOnly10k(b *testing.B) {
	raw := benchDump(b, 10000)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		var d configdump.Dump
		if err := json.Unmarshal(raw, &d); err != nil {
			b.Fatal(err)
		}
	}
}
