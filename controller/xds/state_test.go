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

func TestAckOfOwn(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		nonce string
		sent  uint64
		want  bool
	}{
		{"no nonce", "", 3, false},
		{"istioctl's nonce, the time", "2026-08-22 10:00:00.123 +0000 UTC m=+0.5", 3, false},
		{"the last answer's", "3", 3, true},
		{"an earlier answer's", "1", 3, true},
		{"not sent yet", "4", 3, false},
		{"nothing sent yet", "1", 0, false},
		{"zero", "0", 3, false},
		{"not canonical", "03", 3, false},
		{"signed", "+3", 3, false},
	} {
		if got := ackOfOwn(tt.nonce, tt.sent); got != tt.want {
			t.Errorf("%s: ackOfOwn(%q, %d) = %v, want %v", tt.name, tt.nonce, tt.sent, got, tt.want)
		}
	}
}
