package xds

import "testing"

func TestTypeStateStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		st   typeState
		want string
	}{
		{"nothing sent", typeState{}, NotSent},
		{"sent, not acknowledged", typeState{nonceSent: "2", nonceAcked: "1"}, Stale},
		{"acknowledged", typeState{nonceSent: "2", nonceAcked: "2"}, Synced},
		{"last response rejected", typeState{nonceSent: "2", nonceAcked: "1", nack: "bad", nackNonce: "2"}, Error},
		{"an older rejection, newer response in flight", typeState{nonceSent: "3", nonceAcked: "1", nack: "bad", nackNonce: "2"}, Stale},
	} {
		if got := tt.st.status(); got != tt.want {
			t.Errorf("%s: status() = %q, want %q", tt.name, got, tt.want)
		}
	}
}
