package origdst

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestDecide(t *testing.T) {
	pod := netip.MustParseAddr("10.1.0.5")
	// own as the proxy has it: its in-pod ports on the pod's address or
	// loopback.
	own := func(a netip.AddrPort) bool {
		return slices.Contains([]uint16{15001, 15006, 15008, 15053}, a.Port()) && (a.Addr() == pod || a.Addr().IsLoopback())
	}
	ap := netip.MustParseAddrPort
	noEntry := fmt.Errorf("SO_ORIGINAL_DST: %w", unix.ENOENT)
	for _, tc := range []struct {
		name    string
		orig    netip.AddrPort
		err     error
		local   netip.AddrPort
		want    netip.AddrPort
		wantErr error
	}{
		{name: "REDIRECT: the conntrack entry", orig: ap("10.96.0.1:443"), local: ap("[::ffff:127.0.0.1]:15001"), want: ap("10.96.0.1:443")},
		{name: "REDIRECT to the pod's 15006: the conntrack entry", orig: ap("10.1.0.5:8080"), local: ap("10.1.0.5:15006"), want: ap("10.1.0.5:8080")},
		{name: "unNATed outbound: the local address", err: noEntry, local: ap("[::ffff:10.96.0.1]:443"), want: ap("10.96.0.1:443")},
		{name: "unNATed IPv6 outbound: the local address", err: noEntry, local: ap("[fd00::1]:80"), want: ap("[fd00::1]:80")},
		{name: "unNATed inbound: the pod's port", err: noEntry, local: ap("10.1.0.5:8080"), want: ap("10.1.0.5:8080")},
		{name: "a remote address's 15001 is a destination", err: noEntry, local: ap("192.0.2.7:15001"), want: ap("192.0.2.7:15001")},
		{name: "no conntrack in the kernel: the local address", err: unix.ENOPROTOOPT, local: ap("192.0.2.7:80"), want: ap("192.0.2.7:80")},
		{name: "the pod's own 15001 is the proxy", err: noEntry, local: ap("[::ffff:10.1.0.5]:15001"), wantErr: ErrOwnListener},
		{name: "the pod's own 15006 is the proxy", err: noEntry, local: ap("10.1.0.5:15006"), wantErr: ErrOwnListener},
		{name: "loopback 15008 is the proxy", err: noEntry, local: ap("127.0.0.1:15008"), wantErr: ErrOwnListener},
		{name: "IPv6 loopback 15053 is the proxy", err: noEntry, local: ap("[::1]:15053"), wantErr: ErrOwnListener},
		{name: "another error is the connection's", err: unix.EBADF, local: ap("192.0.2.7:80"), wantErr: unix.EBADF},
		{name: "no entry and no local address", err: noEntry, wantErr: unix.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.orig, tc.err, tc.local, own)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("destination (-want +got):\n%s", diff)
			}
		})
	}
}
