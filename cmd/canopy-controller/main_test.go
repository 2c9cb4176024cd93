package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/controller/leader"
	"github.com/canopy-mesh/canopy/controller/vipalloc"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"--cluster-id=east", "--log-level=debug", "--monitoring-addr=127.0.0.1:0"})
	if err != nil || c.mesh.ClusterID != "east" || c.logLevel.String() != "DEBUG" {
		t.Fatalf("parseFlags = %+v, %v", c, err)
	}
	if want := (pki.TTLRange{Default: 24 * time.Hour, Min: 10 * time.Minute, Max: 24 * time.Hour}); c.certTTL != want {
		t.Errorf("certificate lifetimes %+v, want %+v", c.certTTL, want)
	}
	if c.mesh.DefaultExportTo != nil {
		t.Errorf("DefaultExportTo = %q without the flag, want unset (the builders default it to *)", c.mesh.DefaultExportTo)
	}
	c, err = parseFlags([]string{"--default-export-to=., istio-system"})
	if err != nil || strings.Join(c.mesh.DefaultExportTo, "|") != ".|istio-system" {
		t.Errorf("--default-export-to: %q, %v", c.mesh.DefaultExportTo, err)
	}
	if !c.vipAllocation || c.vipRanges != vipalloc.DefaultRanges() {
		t.Errorf("VIP allocation %v from %+v by default, want on from istiod's ranges", c.vipAllocation, c.vipRanges)
	}
	c, err = parseFlags([]string{"--serviceentry-vip-ipv4-range=240.1.0.0/24", "--serviceentry-vip-ipv6-range=fd00:1::/64"})
	if err != nil || c.vipRanges.IPv4.String() != "240.1.0.0/24" || c.vipRanges.IPv6.String() != "fd00:1::/64" {
		t.Errorf("VIP ranges: %+v, %v", c.vipRanges, err)
	}
	for _, bad := range [][]string{{"--serviceentry-vip-ipv4-range=fd00::/64"}, {"--serviceentry-vip-ipv6-range=junk"}, {"--log-level=loud"}, {"--monitoring-addr=15014"}, {"--no-such-flag"}, {"--default-export-to=,"},
		{"--cert-min-ttl=0s"}, {"--cert-default-ttl=48h"}, {"--cert-min-ttl=2h", "--cert-default-ttl=1h"}} {
		if _, err := parseFlags(bad); err == nil || strings.Contains(err.Error(), "panic") {
			t.Errorf("parseFlags(%v) = %v, want an error", bad, err)
		}
	}
}

// TestPlaintextXDS: plaintext xDS carries bearer tokens in clear text: off
// by default, and when on, on loopback unless remote callers are allowed
// explicitly.
func TestPlaintextXDS(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		want    string
		wantErr string
	}{
		{name: "off by default", want: ""},
		{name: "loopback", args: []string{"--xds-addr=127.0.0.1:15010"}, want: "127.0.0.1:15010"},
		{name: "IPv6 loopback", args: []string{"--xds-addr=[::1]:15010"}, want: "[::1]:15010"},
		{name: "every address needs the opt-in", args: []string{"--xds-addr=:15010"}, wantErr: "--xds-plaintext-remote"},
		{name: "a pod address needs the opt-in", args: []string{"--xds-addr=10.0.0.1:15010"}, wantErr: "--xds-plaintext-remote"},
		{name: "remote with the opt-in", args: []string{"--xds-addr=:15010", "--xds-plaintext-remote"}, want: ":15010"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseFlags(%v) = %v, want an error naming %s", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil || c.xdsAddr != tt.want {
				t.Errorf("parseFlags(%v): xDS address %q, %v; want %q", tt.args, c.xdsAddr, err, tt.want)
			}
		})
	}
}

// TestWebhookFlags: the injection webhook's flags become the injector's
// configuration, validation is served unless turned off, and values that
// cannot work stop the start.
func TestWebhookFlags(t *testing.T) {
	c, err := parseFlags([]string{"--ca-namespace=mesh", "--proxy-hub=example.test/istio", "--proxy-tag=1.0.0", "--revision=canary",
		"--inject-cni", "--inject-native-sidecars", "--trust-domain=td.example", "--cluster-id=east"})
	if err != nil {
		t.Fatal(err)
	}
	if c.webhookAddr != ":15017" || c.webhookMaxRequests != 100 || !c.validation {
		t.Errorf("webhook %q, %d requests, validation %v; want :15017, 100, true", c.webhookAddr, c.webhookMaxRequests, c.validation)
	}
	if c, err := parseFlags([]string{"--validation-webhook=false"}); err != nil || c.validation {
		t.Errorf("--validation-webhook=false: validation %v, %v", c.validation, err)
	}
	in := c.inject
	if in.Hub != "example.test/istio" || in.Tag != "1.0.0" || in.Revision != "canary" || !in.CNI || !in.NativeSidecars ||
		in.DiscoveryAddress != "canopy-controller.mesh.svc:15012" || in.SystemNamespace != "mesh" ||
		in.TrustDomain != "td.example" || in.ClusterID != "east" || in.DenyReason != "" {
		t.Errorf("injector config %+v", in)
	}
	c, err = parseFlags([]string{`--never-inject-selector=[{"matchLabels":{"app":"batch"}}]`,
		`--always-inject-selector=[{"matchExpressions":[{"key":"mesh","operator":"Exists"}]},{"matchLabels":{"a":"b"}}]`})
	if err != nil || len(c.inject.NeverInjectSelector) != 1 || c.inject.NeverInjectSelector[0].MatchLabels["app"] != "batch" ||
		len(c.inject.AlwaysInjectSelector) != 2 || c.inject.AlwaysInjectSelector[0].MatchExpressions[0].Key != "mesh" {
		t.Errorf("inject selectors %+v, %+v, %v", c.inject.NeverInjectSelector, c.inject.AlwaysInjectSelector, err)
	}
	c, err = parseFlags(nil)
	if err != nil || !strings.Contains(c.inject.DenyReason, "--proxy-tag") {
		t.Errorf("without an image: deny reason %q, %v; want one naming the flags", c.inject.DenyReason, err)
	}
	if c, err := parseFlags([]string{"--webhook-addr=", "--proxy-hub=only"}); err != nil || c.webhookAddr != "" {
		t.Errorf("--webhook-addr= : %q, %v; want no webhook, and its flags unchecked", c.webhookAddr, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-hub=example.test/istio"}, "set both or neither"},
		{[]string{"--proxy-tag=1.0.0"}, "set both or neither"},
		{[]string{"--proxy-hub=example.test/istio", "--proxy-tag=1.0 .0"}, "white space"},
		{[]string{"--revision=Not_A/Label"}, "revision"},
		{[]string{"--discovery-address=canopy-controller"}, "--discovery-address"},
		{[]string{"--webhook-addr=15017"}, "--webhook-addr"},
		{[]string{"--webhook-max-requests=0"}, "--webhook-max-requests"},
		{[]string{"--never-inject-selector={}"}, "--never-inject-selector"},
		{[]string{`--always-inject-selector=[{"matchLabel":{"a":"b"}}]`}, "--always-inject-selector"},
		{[]string{"--proxy-hub=h", "--proxy-tag=t", `--never-inject-selector=[{"matchExpressions":[{"key":"a","operator":"Near"}]}]`}, "neverInjectSelector[0]"},
	} {
		if _, err := parseFlags(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%v) = %v, want an error naming %s", tt.args, err, tt.want)
		}
	}
}

// TestLeaderFlags: the writers' Lease is in the CA namespace, named after
// the revision so that two revisions never share one, and durations
// client-go would refuse stop the start.
func TestLeaderFlags(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		want    leader.Config
		wantErr string
	}{
		{name: "defaults", args: []string{"--ca-namespace=mesh", "--id=c-1"},
			want: leader.Config{Namespace: "mesh", Name: "canopy-controller", Identity: "c-1",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}},
		{name: "a revision has its own lease", args: []string{"--ca-namespace=mesh", "--id=c-1", "--revision=canary"},
			want: leader.Config{Namespace: "mesh", Name: "canopy-controller-canary", Identity: "c-1",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}},
		{name: "the default revision shares the plain name", args: []string{"--ca-namespace=mesh", "--id=c-1", "--revision=default"},
			want: leader.Config{Namespace: "mesh", Name: "canopy-controller", Identity: "c-1",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}},
		{name: "named and timed", args: []string{"--ca-namespace=mesh", "--id=c-1", "--leader-election-lease=mine",
			"--leader-lease-duration=4s", "--leader-renew-deadline=2s", "--leader-retry-period=500ms"},
			want: leader.Config{Namespace: "mesh", Name: "mine", Identity: "c-1",
				LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}},
		{name: "renew deadline not under the lease", args: []string{"--leader-lease-duration=10s", "--leader-renew-deadline=10s"}, wantErr: "--leader-lease-duration"},
		{name: "retry period too long", args: []string{"--leader-retry-period=9s"}, wantErr: "--leader-retry-period"},
		{name: "no identity", args: []string{"--id="}, wantErr: "--id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseFlags(%v) = %v, want an error naming %s", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.leaderElect {
				t.Error("leader election off by default")
			}
			if diff := cmp.Diff(tt.want, c.leader); diff != "" {
				t.Errorf("leader config (-want +got):\n%s", diff)
			}
		})
	}
	// Without election nothing is checked: one replica writes always.
	if _, err := parseFlags([]string{"--leader-elect=false", "--id="}); err != nil {
		t.Errorf("--leader-elect=false --id= : %v", err)
	}
}
