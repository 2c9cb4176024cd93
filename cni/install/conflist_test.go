package install

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const testEntry = `{"type":"canopy-cni"}`

// TestChain: the entry goes after the last primary plugin, separated and
// indented as the plugins are; no other byte moves.
func TestChain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, raw     string
		want          string // "": already in place
		wantConverted bool
		wantErr       string
	}{
		{
			name: "compact",
			raw:  `{"name":"n","plugins":[{"type":"a"}]}`,
			want: `{"name":"n","plugins":[{"type":"a"},{"type":"canopy-cni"}]}`,
		},
		{
			name: "spaced as the plugins are",
			raw:  `{"plugins": [ {"type":"a"} , {"type":"b"} ] }`,
			want: `{"plugins": [ {"type":"a"} , {"type":"b"} , {"type":"canopy-cni"} ] }`,
		},
		{
			name: "indented as the plugins are",
			raw:  "{\n  \"plugins\": [\n    {\"type\": \"a\"}\n  ]\n}\n",
			want: "{\n  \"plugins\": [\n    {\"type\": \"a\"},\n    {\n      \"type\": \"canopy-cni\"\n    }\n  ]\n}\n",
		},
		{
			name: "tabs and CRLF",
			raw:  "{\r\n\t\"plugins\": [\r\n\t\t{\"type\": \"a\"},\r\n\t\t{\"type\": \"b\"}\r\n\t]\r\n}",
			want: "{\r\n\t\"plugins\": [\r\n\t\t{\"type\": \"a\"},\r\n\t\t{\"type\": \"b\"},\r\n\t\t{\r\n\t\t\t\"type\": \"canopy-cni\"\r\n\t\t}\r\n\t]\r\n}",
		},
		{
			name: "comma first: no indenting",
			raw:  "{\"plugins\": [ {\"type\": \"a\"}\n  , {\"type\": \"b\"}]}",
			want: "{\"plugins\": [ {\"type\": \"a\"}\n  , {\"type\": \"b\"}\n  , {\"type\":\"canopy-cni\"}]}",
		},
		{
			name: "a stale entry moves to the end",
			raw:  `{"plugins":[{"type":"a"},{"type":"canopy-cni","old":1},{"type":"b"}]}`,
			want: `{"plugins":[{"type":"a"},{"type":"b"},{"type":"canopy-cni"}]}`,
		},
		{
			name: "entries first, and last but changed",
			raw:  `{"plugins":[{"type":"canopy-cni"}, {"type":"canopy-cni"}, {"type":"a"},{"type":"canopy-cni","old":1}]}`,
			want: `{"plugins":[{"type":"a"},{"type":"canopy-cni"}]}`,
		},
		{
			name: "in place with other spacing and key order",
			raw:  `{"plugins":[{"type":"a"}, { "type" : "canopy-cni" }]}`,
		},
		{
			name: "the last of two plugin lists, which libcni reads",
			raw:  `{"plugins":[{"type":"x"}],"plugins":[{"type":"a"}]}`,
			want: `{"plugins":[{"type":"x"}],"plugins":[{"type":"a"},{"type":"canopy-cni"}]}`,
		},
		{
			name: "the values libcni and a re-encoding would change",
			raw:  `{"x":1.50,"plugins":[{"type":"a","mtu":9007199254740993,"s":"<&>\u00e9"}]}`,
			want: `{"x":1.50,"plugins":[{"type":"a","mtu":9007199254740993,"s":"<&>\u00e9"},{"type":"canopy-cni"}]}`,
		},
		{
			name: "a single plugin becomes a list of it",
			raw:  " {\"cniVersion\":\"1.0.0\", \"name\":\"n\",\"type\":\"a\"}\n",
			want: "{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"plugins\":[ {\"cniVersion\":\"1.0.0\", \"name\":\"n\",\"type\":\"a\"}, {\"type\":\"canopy-cni\"}]}\n", wantConverted: true,
		},
		{
			name: "a single plugin without cniVersion",
			raw:  `{"name":"n","type":"a"}`,
			want: `{"name":"n","plugins":[{"name":"n","type":"a"},{"type":"canopy-cni"}]}`, wantConverted: true,
		},
		{name: "a line comment", raw: "{\"plugins\": [{\"type\": \"a\"}] // ours\n}", wantErr: "a comment at byte 28"},
		{name: "a block comment", raw: `{/* ours */"plugins": [{"type": "a"}]}`, wantErr: "a comment at byte 1"},
		{name: "broken", raw: `{"plugins": [`, wantErr: "not JSON: unexpected end"},
		{name: "two values", raw: `{"plugins": []} {}`, wantErr: "not JSON"},
		{name: "not an object", raw: `[{"type": "a"}]`, wantErr: "not a JSON object"},
		{name: "plugins not a list", raw: `{"type":"a","plugins":{}}`, wantErr: `"plugins" is not a list`},
		{name: "empty list", raw: `{"plugins":[]}`, wantErr: "an empty plugin list"},
		{name: "only ours", raw: `{"plugins":[{"type":"canopy-cni","old":1}]}`, wantErr: "an empty plugin list"},
		{name: "neither", raw: `{"name":"n"}`, wantErr: `neither "plugins" nor "type"`},
		{name: "a single plugin without a name", raw: `{"type":"a"}`, wantErr: `no "name" string`},
		{name: "a single plugin named with a number", raw: `{"type":"a","name":1}`, wantErr: `no "name" string`},
		{name: "a single plugin of ours", raw: `{"type":"canopy-cni","name":"n"}`, wantErr: "its only plugin is canopy-cni"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, converted, err := chain([]byte(tt.raw), []byte(testEntry))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("chain() = %q, %v; want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("chain() (-want +got):\n%s", diff)
			}
			if converted != tt.wantConverted {
				t.Errorf("converted = %v, want %v", converted, tt.wantConverted)
			}
		})
	}
}

// TestUnchain: the entry goes with what appendEntry added; a list that is
// exactly what listOf made is its single plugin again, anything else stays
// a list.
func TestUnchain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, raw, want, wantSingle string
	}{
		{name: "none of ours", raw: `{"plugins":[{"type":"a"}]}`},
		{name: "not a list", raw: `{"name":"n","type":"a"}`},
		{
			name: "the entry", raw: "{\"plugins\": [\n  {\"type\": \"a\"},\n  {\n    \"type\": \"canopy-cni\"\n  }\n]}",
			want: "{\"plugins\": [\n  {\"type\": \"a\"}\n]}",
		},
		{
			name: "a converted single plugin",
			raw:  "{\"name\":\"n\",\"plugins\":[\t{\"name\":\"n\",\"type\":\"a\"},{\"type\":\"canopy-cni\"}]}\n",
			want: "{\"name\":\"n\",\"plugins\":[\t{\"name\":\"n\",\"type\":\"a\"}]}\n", wantSingle: "\t{\"name\":\"n\",\"type\":\"a\"}\n",
		},
		{
			name: "a list named otherwise than its plugin stays a list",
			raw:  `{"name":"list","plugins":[{"name":"n","type":"a"},{"type":"canopy-cni"}]}`,
			want: `{"name":"list","plugins":[{"name":"n","type":"a"}]}`,
		},
		{
			name: "a list with another key stays a list",
			raw:  `{"name":"n","disableCheck":true,"plugins":[{"name":"n","type":"a"},{"type":"canopy-cni"}]}`,
			want: `{"name":"n","disableCheck":true,"plugins":[{"name":"n","type":"a"}]}`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, single, err := unchain([]byte(tt.raw))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([2]string{tt.want, tt.wantSingle}, [2]string{string(got), string(single)}); diff != "" {
				t.Errorf("unchain() without ours, single (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzChain: for any configuration chain accepts, the result is JSON whose
// last plugin is the entry and only one of ours; every other byte, the
// primary plugins' included, is the input's (less any entry of ours it
// had); chaining again changes nothing; and unchaining gives back the
// input byte for byte (a single-plugin configuration included). The input
// is untrusted: another vendor writes it.
func FuzzChain(f *testing.F) {
	for _, seed := range []string{
		vendorConflist,
		`{"name":"n","plugins":[{"type":"a"}]}`,
		"{\n  \"plugins\": [\n    {\"type\": \"a\"}\n  ]\n}\n",
		`{"plugins":[{"type":"canopy-cni"},{"type":"a"},{"type":"canopy-cni","old":1}]}`,
		`{"plugins":[{"type":"x"}],"plugins":[{"type":"a"}]}`,
		" {\"cniVersion\":\"1.0.0\", \"name\":\"n\",\"type\":\"a\",\"big\":9007199254740993}\n",
		`{"name":"n","plugins":[{"name":"n","type":"a"}]}`,
		`{"\u0070lugins":[{"TYPE":"canopy-cni"},{"type":"a"}]}`,
		"{\"plugins\": [{\"type\": \"a\"}] // ours\n}",
	} {
		f.Add([]byte(seed))
	}
	entry := []byte(`{"agentSocket":"/var/run/canopy/cni.sock","excludeNamespaces":["kube-system"],"type":"canopy-cni"}`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		orig := bytes.Clone(raw)
		out, converted, err := chain(raw, entry)
		if !bytes.Equal(raw, orig) {
			t.Fatal("chain changed its input")
		}
		if err != nil {
			return
		}
		if out == nil {
			out = raw
		}
		if !json.Valid(out) {
			t.Fatalf("not JSON:\n%s", out)
		}
		d, err := parseDocument(out)
		if err != nil {
			t.Fatal(err)
		}
		_, elems, _, err := d.plugins()
		if err != nil || len(elems) < 2 {
			t.Fatalf("plugins %v, %v in\n%s", elems, err, out)
		}
		if !sameJSON(d.bytes(elems[len(elems)-1]), entry) || ours(d, elems[:len(elems)-1]) != -1 {
			t.Fatalf("the entry is not the only one of ours and last:\n%s", out)
		}
		if again, _, err := chain(out, entry); err != nil || again != nil {
			t.Fatalf("chaining again = %q, %v", again, err)
		}
		back, single, err := unchain(out)
		if err != nil {
			t.Fatal(err)
		}
		if converted {
			if !bytes.Equal(single, raw) {
				t.Fatalf("unchain gives back\n%q\nnot\n%q", single, raw)
			}
			return
		}
		// The input, less the entries of ours it had.
		want, _, err := unchainList(raw)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, want) {
			t.Fatalf("unchain gives back\n%q\nnot\n%q", back, want)
		}
		// And that is the input everywhere but in its plugin list, and
		// its plugins, byte for byte, but ours.
		w, err := parseDocument(want)
		if err != nil {
			t.Fatal(err)
		}
		wl, welems, _, err := w.plugins()
		if err != nil {
			t.Fatal(err)
		}
		r, err := parseDocument(raw)
		if err != nil {
			t.Fatal(err)
		}
		rl, relems, _, err := r.plugins()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw[:rl.start], want[:wl.start]) || !bytes.Equal(raw[rl.end:], want[wl.end:]) {
			t.Fatalf("bytes outside the plugin list changed:\n%q\n%q", raw, want)
		}
		var kept [][]byte
		for _, e := range relems {
			if !isOurs(r.bytes(e)) {
				kept = append(kept, r.bytes(e))
			}
		}
		var got [][]byte
		for _, e := range welems {
			got = append(got, w.bytes(e))
		}
		if diff := cmp.Diff(kept, got); diff != "" {
			t.Fatalf("primary plugins (-want +got):\n%s", diff)
		}
	})
}
