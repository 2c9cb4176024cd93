package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"--node-name=n1", "--backend=iptables", "--excluded-namespaces=kube-system, ops", "--probe-uid=1001"})
	if err != nil || c.nodeName != "n1" || c.backend != "iptables" || len(c.enroll.ExcludedNamespaces) != 2 || c.probeUID != 1001 {
		t.Fatalf("parseFlags = %+v, %v", c, err)
	}
	if d, err := parseFlags([]string{"--node-name=n1"}); err != nil || d.startupTaint != "cni.canopy.dev/not-ready" || d.probeUID != 0 ||
		d.namespaceRecord != "/var/run/canopy/namespaces.json" || d.stateDir != "/var/run/canopy" || !d.enroll.SidecarCapture ||
		!d.guardPorts || d.guardRoot != "/sys/fs/bpf/canopy-guard" || d.cgroupRoot != "/sys/fs/cgroup" {
		t.Errorf("parseFlags defaults = %+v, %v", d, err)
	}
	if d, err := parseFlags([]string{"--node-name=n1", "--startup-taint=", "--namespace-record=", "--sidecar-capture=false"}); err != nil || d.startupTaint != "" || d.namespaceRecord != "" || d.enroll.SidecarCapture {
		t.Errorf("parseFlags with the taint and the record off = %+v, %v", d, err)
	}
	if e, err := parseFlags([]string{"--node-name=n1", "--backend=ebpf", "--bpf-root=/sys/fs/bpf/canopy/"}); err != nil || e.backend != "ebpf" || e.bpfRoot != "/sys/fs/bpf/canopy" {
		t.Errorf("parseFlags with the ebpf backend = %+v, %v", e, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-name="}, "--node-name"},
		{[]string{"--node-name=n", "--backend=bpf"}, "want nftables, iptables or ebpf"},
		{[]string{"--node-name=n", "--backend=ebpf", "--bpf-root=canopy"}, "--bpf-root"},
		{[]string{"--node-name=n", "--backend=ebpf", "--bpf-root=/"}, "--bpf-root"},
		{[]string{"--node-name=n", "--probe-snat=fd00::1"}, "IPv4"},
		{[]string{"--node-name=n", "--reconcile-period=0s"}, "positive"},
		{[]string{"--node-name=n", "--probe-uid=-5"}, "user ID"},
		{[]string{"--node-name=n", "--probe-uid=-1"}, "not looked up"},
		{[]string{"--node-name=n", "--probe-uid=4294967296"}, "user ID"},
		{[]string{"--node-name=n", "--log-level=loud"}, "log-level"},
		{[]string{"--node-name=n", "--startup-taint=not a key"}, "--startup-taint"},
		{[]string{"--node-name=../n"}, "--node-name"},
		{[]string{"--node-name=n", "--guard-root=guard"}, "--guard-root"},
		{[]string{"--node-name=n", "--guard-root=/sys/fs/bpf/canopy/guard"}, "not under --bpf-root"},
		{[]string{"--node-name=n", "--guard-root=/sys/fs/bpf/canopy"}, "not under --bpf-root"},
	} {
		if _, err := parseFlags(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%v) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
