package redirect

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPortRanges(t *testing.T) {
	for _, tt := range []struct {
		in, out string
		want    []portRange
		wantErr bool
	}{
		{in: "\n", out: "", want: nil},
		{in: "8080\n", out: "8080", want: []portRange{{8080, 8080}}},
		{in: "15001,15006-15008,15053\n", out: "15001,15006-15008,15053", want: []portRange{{15001, 15001}, {15006, 15008}, {15053, 15053}}},
		{in: "9000-8000", wantErr: true},
		{in: "70000", wantErr: true},
		{in: "a", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parsePortRanges(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parsePortRanges(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(portRange{})); diff != "" {
				t.Errorf("parsePortRanges(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if err == nil {
				if s := formatPortRanges(got); s != tt.out {
					t.Errorf("formatPortRanges = %q, want %q", s, tt.out)
				}
			}
		})
	}
}

func TestInnermostTgid(t *testing.T) {
	for _, tt := range []struct {
		name, status string
		want         uint32
		wantErr      bool
	}{
		{"the node's PID namespace", "Name:\tcanopy-node\nTgid:\t4242\nNSpid:\t4242\n", 4242, false},
		{"a namespace of its own", "Tgid:\t4242\nNSpid:\t4242\t1\n", 1, false},
		{"no NSpid (a kernel before 4.1)", "Tgid:\t4242\n", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "status")
			if err := os.WriteFile(path, []byte(tt.status), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := innermostTgid(path)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("innermostTgid = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestAutoboundGuardedPorts(t *testing.T) {
	for _, tt := range []struct {
		name, portRange, reserved string
		want                      []uint16
		wantErr                   bool
	}{
		{"the kernel's defaults", DefaultPortRange, "", nil, false},
		{"a range over the proxy's ports", "15000 15100", "", []uint16{15001, 15006, 15008, 15053}, false},
		{"some reserved", "15000 15100", "15001,15006-15008", []uint16{15053}, false},
		{"all reserved", "1024 65535", "15001,15006,15008,15053", nil, false},
		{"a range ending between them", "15002 15007", "", []uint16{15006}, false},
		{"tabs, as the kernel prints it", "15000\t15010\n", "", []uint16{15001, 15006, 15008}, false},
		{"one port", "15001", "", nil, true},
		{"a bad reservation", DefaultPortRange, "x", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AutoboundGuardedPorts(tt.portRange, tt.reserved)
			if (err != nil) != tt.wantErr {
				t.Fatalf("AutoboundGuardedPorts(%q, %q) error %v, want error %v", tt.portRange, tt.reserved, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("AutoboundGuardedPorts(%q, %q) mismatch (-want +got):\n%s", tt.portRange, tt.reserved, diff)
			}
		})
	}
}

func TestStartTime(t *testing.T) {
	for _, tt := range []struct {
		name, stat string
		want       uint64
		wantErr    bool
	}{
		{"plain", "4242 (canopy-node) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 987654 1000 200\n", 987654, false},
		{"a command with spaces and parentheses", "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 1234 1000 200\n", 1234, false},
		{"cut short", "4242 (canopy-node) S 1 4242\n", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stat")
			if err := os.WriteFile(path, []byte(tt.stat), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := startTime(path)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("startTime = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
