package parity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	goldenfile "github.com/canopy-mesh/canopy/internal/testing/golden"
)

// fixtureFiles are the objects the parity test applies.
var fixtureFiles = []string{"cluster.yaml", "proxyless.yaml", "traffic.yaml"}

// TestFixturesCoverFields writes, for every field of the networking kinds
// sidecars read (from the API's descriptors, sidecar.FieldUses), what
// Canopy does with it and whether a parity fixture sets it
// (testdata/field-coverage.golden, -update): a field the fixtures stop
// setting, or a new field of the API, shows as a diff. It logs how many
// of the translated fields the fixtures cover.
func TestFixturesCoverFields(t *testing.T) {
	set := map[string][]string{}
	for _, f := range fixtureFiles {
		specs, err := readSpecs(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		for kind, ms := range specs {
			for _, m := range ms {
				set[kind] = append(set[kind], sidecar.SetFieldPaths(m)...)
			}
		}
	}
	var b strings.Builder
	for _, kind := range []string{"DestinationRule", "ServiceEntry", "Sidecar", "VirtualService", "WorkloadEntry"} {
		covered, translated := 0, 0
		b.WriteString("# " + kind + "\n")
		for _, line := range sidecar.FieldUses(kind) {
			path, use, _ := strings.Cut(line, " ")
			mark := "-"
			if slices.Contains(set[kind], path) {
				mark = "covered"
			}
			if use == "translated" {
				translated++
				if mark == "covered" {
					covered++
				}
			}
			fmt.Fprintf(&b, "%s %s: %s\n", path, use, mark)
		}
		t.Logf("%s: fixtures set %d of %d translated fields", kind, covered, translated)
	}
	goldenfile.Check(t, "field-coverage.golden", []byte(b.String()))
}

// readSpecs decodes the specs of the networking kinds in a fixture file.
func readSpecs(path string) (map[string][]proto.Message, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string][]proto.Message{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode %s: %w", path, err)
		}
		var obj struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			raw        []byte
		}
		if err := json.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("decode %s: %w", path, err)
		}
		obj.raw = doc
		if !strings.HasPrefix(obj.APIVersion, "networking.istio.io/") {
			continue
		}
		// Decoded as the controller's informers decode them (durations
		// such as "5m" included).
		var m proto.Message
		var err error
		switch obj.Kind {
		case "DestinationRule":
			var o networkingv1.DestinationRule
			err, m = json.Unmarshal(obj.raw, &o), &o.Spec
		case "VirtualService":
			var o networkingv1.VirtualService
			err, m = json.Unmarshal(obj.raw, &o), &o.Spec
		case "ServiceEntry":
			var o networkingv1.ServiceEntry
			err, m = json.Unmarshal(obj.raw, &o), &o.Spec
		case "Sidecar":
			var o networkingv1.Sidecar
			err, m = json.Unmarshal(obj.raw, &o), &o.Spec
		case "WorkloadEntry":
			var o networkingv1.WorkloadEntry
			err, m = json.Unmarshal(obj.raw, &o), &o.Spec
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s in %s: %w", obj.Kind, path, err)
		}
		out[obj.Kind] = append(out[obj.Kind], m)
	}
}
