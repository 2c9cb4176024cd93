package parity

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// The Field of a difference that is a whole resource sent by one side only.
const (
	onlyIstiod = "(sent by istiod only)"
	onlyCanopy = "(sent by canopy only)"
)

// difference is one way the two control planes' tables differ: a field of
// a resource both sent, or a resource only one sent.
type difference struct {
	Type     string `json:"type"`     // the message name of the type: Address, Listener, ...
	Resource string `json:"resource"` // the xDS resource name
	Field    string `json:"field"`    // a field path, onlyIstiod or onlyCanopy
}

// allowed is an entry of the allow-list: a difference and why it is
// accepted.
type allowed struct {
	difference `json:",inline"`
	Why        string `json:"why"`
	// Sometimes marks a difference that depends on a choice istiod makes
	// differently from run to run: an entry that accepted nothing in a
	// run is not stale.
	Sometimes bool `json:"sometimes,omitempty"`
}

// resourceDiff is how one resource differs: its differing fields and the
// diff text for people (-istiod +canopy).
type resourceDiff struct {
	typ, name string
	fields    []string
	text      string
}

// score counts, per type, the resources both sides sent identically out
// of all names either sent.
type score struct {
	typ              string
	identical, total int
}

// shortType is the message name of a type URL: Address, Authorization.
func shortType(typeURL string) string {
	return typeURL[strings.LastIndex(typeURL, ".")+1:]
}

// decode unpacks a resource of a type into its message.
func decode(typeURL string, a *anypb.Any) (proto.Message, error) {
	var m proto.Message
	switch typeURL {
	case workloadapi.AddressTypeURL:
		m = &workloadapi.Address{}
	case workloadapi.AuthorizationTypeURL:
		m = &security.Authorization{}
	case listenerType:
		m = &listenerv3.Listener{}
	case routeType:
		m = &routev3.RouteConfiguration{}
	case clusterType:
		m = &clusterv3.Cluster{}
	case endpointType:
		m = &endpointv3.ClusterLoadAssignment{}
	default:
		return nil, fmt.Errorf("unknown type %s", typeURL)
	}
	if err := a.UnmarshalTo(m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", a.GetTypeUrl(), err)
	}
	return m, nil
}

// compareTables diffs two tables of one type resource by resource.
func compareTables(typeURL string, istiod, canopy map[string]*anypb.Any) (score, []resourceDiff, error) {
	names := map[string]bool{}
	for n := range istiod {
		names[n] = true
	}
	for n := range canopy {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	typ := shortType(typeURL)
	sc := score{typ: typ, total: len(sorted)}
	var diffs []resourceDiff
	for _, name := range sorted {
		a, inIstiod := istiod[name]
		b, inCanopy := canopy[name]
		switch {
		case !inCanopy:
			diffs = append(diffs, resourceDiff{typ: typ, name: name, fields: []string{onlyIstiod}})
			continue
		case !inIstiod:
			diffs = append(diffs, resourceDiff{typ: typ, name: name, fields: []string{onlyCanopy}})
			continue
		}
		want, err := decode(typeURL, a)
		if err != nil {
			return score{}, nil, fmt.Errorf("istiod's %s: %w", name, err)
		}
		got, err := decode(typeURL, b)
		if err != nil {
			return score{}, nil, fmt.Errorf("canopy's %s: %w", name, err)
		}
		normalize(want)
		normalize(got)
		fields := fieldDiffs(want, got)
		if len(fields) == 0 {
			sc.identical++
			continue
		}
		diffs = append(diffs, resourceDiff{typ: typ, name: name, fields: fields, text: cmp.Diff(want, got, protocmp.Transform())})
	}
	return sc, diffs, nil
}

// normalize puts what either side may send in any order into one order:
// the endpoints of each locality (istiod's order varies between pushes),
// by address.
func normalize(m proto.Message) {
	cla, ok := m.(*endpointv3.ClusterLoadAssignment)
	if !ok {
		return
	}
	for _, loc := range cla.GetEndpoints() {
		slices.SortStableFunc(loc.GetLbEndpoints(), func(a, b *endpointv3.LbEndpoint) int {
			return strings.Compare(endpointKey(a), endpointKey(b))
		})
	}
}

// endpointKey orders endpoints by address: a socket address, or the
// endpoint ID of an internal address (a tunnel's destination).
func endpointKey(e *endpointv3.LbEndpoint) string {
	a := e.GetEndpoint().GetAddress()
	sa := a.GetSocketAddress()
	return fmt.Sprintf("%s %d %s", sa.GetAddress(), sa.GetPortValue(), a.GetEnvoyInternalAddress().GetEndpointId())
}

// fieldDiffs lists the paths of the fields in which two messages differ,
// e.g. workload.services["apps/web.apps.svc.cluster.local"].ports[0].target_port.
func fieldDiffs(want, got proto.Message) []string {
	var r pathReporter
	cmp.Equal(want, got, protocmp.Transform(), cmp.Reporter(&r))
	slices.Sort(r.paths)
	return slices.Compact(r.paths)
}

// pathReporter is a cmp.Reporter that records the path of every unequal
// leaf of messages compared through protocmp.Transform.
type pathReporter struct {
	steps cmp.Path
	paths []string
}

// PushStep implements cmp.Reporter.
func (r *pathReporter) PushStep(s cmp.PathStep) { r.steps = append(r.steps, s) }

// PopStep implements cmp.Reporter.
func (r *pathReporter) PopStep() { r.steps = r.steps[:len(r.steps)-1] }

// Report implements cmp.Reporter.
func (r *pathReporter) Report(res cmp.Result) {
	if !res.Equal() {
		r.paths = append(r.paths, fieldPath(r.steps))
	}
}

var messageType = reflect.TypeFor[protocmp.Message]()

// fieldPath writes a cmp path through protocmp's maps as a field path:
// a message's field is .name, a map entry [key], a list element [index].
// Bytes (IP addresses) are leaves.
func fieldPath(p cmp.Path) string {
	var b strings.Builder
	for i, s := range p {
		switch s := s.(type) {
		case cmp.MapIndex:
			if i > 0 && p[i-1].Type() == messageType {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				fmt.Fprintf(&b, "%v", s.Key())
			} else {
				fmt.Fprintf(&b, "[%q]", fmt.Sprint(s.Key()))
			}
		case cmp.SliceIndex:
			if i > 0 && p[i-1].Type() == reflect.TypeFor[[]byte]() {
				return b.String()
			}
			x, y := s.SplitKeys()
			if x < 0 {
				x = y
			}
			fmt.Fprintf(&b, "[%d]", x)
		}
	}
	return b.String()
}

// readAllowList reads and checks an allow-list: every entry names one of
// types, a resource and a field exactly, says why, and appears once.
func readAllowList(path string, types ...string) ([]allowed, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []allowed
	if err := yaml.UnmarshalStrict(b, &list); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	seen := map[difference]bool{}
	for i, a := range list {
		switch {
		case !slices.Contains(types, a.Type):
			return nil, fmt.Errorf("%s: entry %d: type %q is not one of %s", path, i, a.Type, strings.Join(types, ", "))
		case a.Resource == "" || a.Field == "" || strings.TrimSpace(a.Why) == "":
			return nil, fmt.Errorf("%s: entry %d (%s %s): resource, field and why are required", path, i, a.Type, a.Resource)
		case seen[a.difference]:
			return nil, fmt.Errorf("%s: entry %d: %s %s %s is listed twice", path, i, a.Type, a.Resource, a.Field)
		}
		seen[a.difference] = true
	}
	return list, nil
}

// judge splits the differences into those the allow-list does not accept,
// and returns the entries that accepted nothing.
func judge(diffs []resourceDiff, list []allowed) (unexpected []resourceDiff, stale []allowed) {
	used := map[difference]bool{}
	ok := map[difference]bool{}
	for _, a := range list {
		ok[a.difference] = true
	}
	for _, d := range diffs {
		var left []string
		for _, f := range d.fields {
			k := difference{Type: d.typ, Resource: d.name, Field: f}
			if ok[k] {
				used[k] = true
				continue
			}
			left = append(left, f)
		}
		if len(left) > 0 {
			d.fields = left
			unexpected = append(unexpected, d)
		}
	}
	for _, a := range list {
		if !used[a.difference] && !a.Sometimes {
			stale = append(stale, a)
		}
	}
	return unexpected, stale
}

// suggest writes allow-list entries for differences, for a person to
// review and give reasons.
func suggest(diffs []resourceDiff) string {
	var b strings.Builder
	for _, d := range diffs {
		for _, f := range d.fields {
			fmt.Fprintf(&b, "- type: %s\n  resource: %q\n  field: %q\n  why: \"TODO\"\n", d.typ, d.name, f)
		}
	}
	return b.String()
}

// view is what the test reads of a subscriber: whether its tables have
// stayed unchanged for a while, and a type's table.
type view interface {
	quietFor(d time.Duration) (bool, error)
	table(typ string) map[string]*anypb.Any
}

// waitQuiet waits until every view has been unchanged for quiet.
func waitQuiet(t *testing.T, what string, views ...view) {
	t.Helper()
	waitQuietAfter(t, what, time.Time{}, views...)
}

// waitQuietAfter waits until every view has been unchanged for quiet, all
// of it after after: a change made at after (which neither view may show)
// has had the time of a debounce to reach each control plane.
func waitQuietAfter(t *testing.T, what string, after time.Time, views ...view) {
	t.Helper()
	eventually.Within(t, settle, fmt.Sprintf("%s unchanged for %s", what, quiet), func() bool {
		if time.Since(after) < quiet {
			return false
		}
		for _, v := range views {
			ok, err := v.quietFor(quiet)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return false
			}
		}
		return true
	})
}

// compareViews diffs istiod's and Canopy's tables of each type, logs each
// type's score (prefixed by label), and fails on every difference
// allowPath's list does not have and on every entry of it that no longer
// differs.
func compareViews(t *testing.T, label string, types []string, istiod, canopy view, allowList []allowed, allowPath string) {
	t.Helper()
	var all []resourceDiff
	for _, typ := range types {
		sc, diffs, err := compareTables(typ, istiod.table(typ), canopy.table(typ))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s%s: %d of %d resources identical", label, sc.typ, sc.identical, sc.total)
		all = append(all, diffs...)
	}
	unexpected, stale := judge(all, allowList)
	for _, d := range unexpected {
		t.Errorf("%s %s differs in %s, which %s does not list (-istiod +canopy):\n%s",
			d.typ, d.name, strings.Join(d.fields, ", "), allowPath, d.text)
	}
	if len(unexpected) > 0 {
		t.Logf("allow-list entries for these, to review and give reasons:\n%s", suggest(unexpected))
	}
	for _, a := range stale {
		t.Errorf("%s lists %s %s %s, which no longer differs: remove the entry", allowPath, a.Type, a.Resource, a.Field)
	}
}
