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
	for _, bad := range [][]string{{"--log-level=loud"}, {"--monitoring-addr=15014"}, {"--no-such-flag"}} {
		if _, err := parseFlags(bad); err == nil || strings.Contains(err.Error(), "panic") {
			t.Errorf("parseFlags(%v) = %v, want an error", bad, err)
		}
	}
}
