package workloadapi

import (
	"errors"
	"strings"
	"testing"
)

func TestParseServiceKey(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in            string
		wantNamespace string
		wantHostname  string
		wantErr       bool
	}{
		{in: "default/echo.default.svc.cluster.local", wantNamespace: "default", wantHostname: "echo.default.svc.cluster.local"},
		{in: "ns-1/*.example.com", wantNamespace: "ns-1", wantHostname: "*.example.com"},
		{in: "a/b", wantNamespace: "a", wantHostname: "b"},

		{in: "", wantErr: true},
		{in: "default", wantErr: true},
		{in: "/echo", wantErr: true},
		{in: "default/", wantErr: true},
		{in: "Default/echo", wantErr: true},
		{in: "-ns/echo", wantErr: true},
		{in: "ns-/echo", wantErr: true},
		{in: strings.Repeat("a", 64) + "/echo", wantErr: true},
		{in: "ns/a/b", wantErr: true},
		{in: "ns/has space", wantErr: true},
		{in: "ns/tab\there", wantErr: true},
		{in: "ns/" + strings.Repeat("h", 254), wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			ns, host, err := ParseServiceKey(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformedName) {
					t.Fatalf("ParseServiceKey(%q) = %q, %q, %v; want ErrMalformedName", tt.in, ns, host, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseServiceKey(%q): %v", tt.in, err)
			}
			if ns != tt.wantNamespace || host != tt.wantHostname {
				t.Errorf("ParseServiceKey(%q) = %q, %q; want %q, %q", tt.in, ns, host, tt.wantNamespace, tt.wantHostname)
			}
			if got := ServiceKey(ns, host); got != tt.in {
				t.Errorf("ServiceKey() = %q, want %q", got, tt.in)
			}
		})
	}
}

func FuzzParseServiceKey(f *testing.F) {
	f.Add("default/echo.default.svc.cluster.local")
	f.Add("ns/*.example.com")
	f.Add("ns/a/b")
	f.Fuzz(func(t *testing.T, s string) {
		ns, host, err := ParseServiceKey(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedName) {
				t.Fatalf("error %v does not wrap ErrMalformedName", err)
			}
			return
		}
		if got := ServiceKey(ns, host); got != s {
			t.Fatalf("ServiceKey(ParseServiceKey(%q)) = %q", s, got)
		}
		if strings.Contains(host, "/") {
			t.Fatalf("hostname %q contains /", host)
		}
	})
}
