package ambient

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	goldenfile "github.com/canopy-mesh/canopy/internal/testing/golden"
)

// checkGolden compares msg, as indented JSON, with testdata/<name>.golden.
// protojson's output is deliberately unstable, so it is re-encoded through
// encoding/json. A nil message is "null".
func checkGolden(t *testing.T, name string, msg proto.Message) {
	t.Helper()
	got := []byte("null\n")
	if msg != nil && msg.ProtoReflect().IsValid() {
		raw, err := protojson.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		v = readableIPs(v, "")
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		got = buf.Bytes()
	}
	goldenfile.Check(t, name+".golden", got)
}

// readableIPs rewrites the base64 of raw IP fields ("address", "addresses")
// as IP text, so that a reviewer reads the golden files; the encoding
// itself is covered by workloadapi's wire vectors.
func readableIPs(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = readableIPs(e, k)
		}
	case []any:
		for i, e := range x {
			x[i] = readableIPs(e, key)
		}
	case string:
		if key == "address" || key == "addresses" {
			if b, err := base64.StdEncoding.DecodeString(x); err == nil {
				if ip, ok := netip.AddrFromSlice(b); ok {
					return ip.String()
				}
			}
		}
	}
	return v
}
