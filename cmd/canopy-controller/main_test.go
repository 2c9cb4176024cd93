package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"--cluster-id=east", "--log-level=debug", "--monitoring-addr=127.0.0.1:0"})
	if err != nil || c.mesh.ClusterID != "east" || c.logLevel.String() != "DEBUG" {
		t.Fatalf("parseFlags = %+v, %v", c, err)
	}
	if c.mesh.DefaultExportTo != nil {
		t.Errorf("DefaultExportTo = %q without the flag, want unset (the builders default it to *)", c.mesh.DefaultExportTo)
	}
	c, err = parseFlags([]string{"--default-export-to=., istio-system"})
	if err != nil || strings.Join(c.mesh.DefaultExportTo, "|") != ".|istio-system" {
		t.Errorf("--default-export-to: %q, %v", c.mesh.DefaultExportTo, err)
	}
	for _, bad := range [][]string{{"--log-level=loud"}, {"--monitoring-addr=15014"}, {"--no-such-flag"}, {"--default-export-to=,"}} {
		if _, err := parseFlags(bad); err == nil || strings.Contains(err.Error(), "panic") {
			t.Errorf("parseFlags(%v) = %v, want an error", bad, err)
		}
	}
}
