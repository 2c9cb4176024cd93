package caclient

import (
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
)

func TestParseChain(t *testing.T) {
	t.Parallel()
	a, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	root := string(pki.EncodeCertificates(a.Roots...))
	if got, err := ParseChain([]string{root, root}); err != nil || len(got) != 2 {
		t.Errorf("ParseChain(two) = %d, %v", len(got), err)
	}
	if got, err := ParseChain([]string{root + root}); err != nil || len(got) != 2 {
		t.Errorf("ParseChain(one element of two) = %d, %v", len(got), err)
	}
	for _, bad := range [][]string{nil, {""}, {"garbage"}, {root + "trailing"}, {"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}} {
		if _, err := ParseChain(bad); err == nil {
			t.Errorf("ParseChain(%.40q) accepted", strings.Join(bad, ""))
		}
	}
}

func FuzzParseChain(f *testing.F) {
	f.Add("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	f.Fuzz(func(t *testing.T, s string) {
		certs, err := ParseChain([]string{s})
		if err == nil && len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
	})
}
