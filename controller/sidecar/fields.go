package sidecar

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	networkingapi "istio.io/api/networking/v1"
)

// FieldUse is what the sidecar generators do with a field of Istio's
// networking API.
type FieldUse int

// Uses of a field.
const (
	// Translated: the field shapes what sidecars and proxyless clients
	// get, as istiod translates it.
	Translated FieldUse = iota
	// NotForSidecars: the field is for gateways, waypoints or node
	// proxies; istiod gives sidecars nothing of it either.
	NotForSidecars
	// Untranslated: Canopy does not translate the field for sidecars
	// (yet, or at all). An object that sets it gets a Warning Event
	// naming it (UntranslatedFields): never dropped silently.
	Untranslated
)

func (u FieldUse) String() string {
	switch u {
	case Translated:
		return "translated"
	case NotForSidecars:
		return "not for sidecars"
	}
	return "untranslated"
}

// fieldUses are the fields that are not Translated, by kind and path (JSON
// names joined by "."); an entry covers the field's whole subtree.
var fieldUses = map[string]map[string]FieldUse{
	"DestinationRule": {
		// A rule with a selector is not used at all (yet): sidecars keep
		// the namespace-wide rule.
		"workloadSelector": Untranslated,
		// Newer than the istiod Canopy is compared with, which ignores
		// them: Envoy's client-side weighted round robin, failure
		// percentage ejection, error codes as 5xx.
		"trafficPolicy.loadBalancer.backendUtilization":                                   Untranslated,
		"trafficPolicy.portLevelSettings.loadBalancer.backendUtilization":                 Untranslated,
		"trafficPolicy.outlierDetection.outlierDetectionHttpErrorCodes":                   Untranslated,
		"trafficPolicy.outlierDetection.failurePercentageThreshold":                       Untranslated,
		"trafficPolicy.portLevelSettings.outlierDetection.outlierDetectionHttpErrorCodes": Untranslated,
		"trafficPolicy.portLevelSettings.outlierDetection.failurePercentageThreshold":     Untranslated,
		// Deprecated and ignored by istiod too.
		"trafficPolicy.outlierDetection.consecutiveErrors":                   NotForSidecars,
		"trafficPolicy.portLevelSettings.outlierDetection.consecutiveErrors": NotForSidecars,
	},
	"VirtualService": {
		// Envoy has no exponential delay, nor an HTTP/2 error to abort
		// with; istiod leaves both out too.
		"http.fault.delay.exponentialDelay": Untranslated,
		"http.fault.abort.http2Error":       Untranslated,
		// Deprecated; matches nothing in istiod either.
		"tcp.match.sourceSubnet": NotForSidecars,
	},
	"ServiceEntry": {},
	"Sidecar": {
		"egress.port":        Untranslated,
		"egress.bind":        Untranslated,
		"egress.captureMode": Untranslated,
		// Of ingress listeners only the connection pool is read: Canopy
		// builds inbound listeners from the workload's services.
		"ingress":                Untranslated,
		"ingress.connectionPool": Translated,
		"outboundTrafficPolicy":  Untranslated,
	},
	"WorkloadEntry": {},
}

// subtreeUse is the use of the field at path of kind: that of the longest
// listed prefix, else Translated.
func subtreeUse(kind, path string) FieldUse {
	uses := fieldUses[kind]
	// A subset's traffic policy is read as the rule's.
	if rest, ok := strings.CutPrefix(path, "subsets.trafficPolicy"); ok && kind == "DestinationRule" {
		path = "trafficPolicy" + rest
	}
	for p := path; ; {
		if u, ok := uses[p]; ok {
			return u
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			return Translated
		}
		p = p[:i]
	}
}

// apiKinds are the specs whose fields are classified, by kind.
var apiKinds = map[string]proto.Message{
	"DestinationRule": &networkingapi.DestinationRule{},
	"VirtualService":  &networkingapi.VirtualService{},
	"ServiceEntry":    &networkingapi.ServiceEntry{},
	"Sidecar":         &networkingapi.Sidecar{},
	"WorkloadEntry":   &networkingapi.WorkloadEntry{},
}

// FieldUses lists every field of a kind's spec, as "path use", in the order
// of the API's descriptors: the field list the parity fixtures are checked
// against.
func FieldUses(kind string) []string {
	var out []string
	walkFields(apiKinds[kind].ProtoReflect().Descriptor(), "", nil, func(path string) {
		out = append(out, path+" "+subtreeUse(kind, path).String())
	})
	return out
}

// walkFields calls f with the path of every field under md, depth first;
// a message already on the path (a recursive type) is not entered again,
// and well-known types (durations, wrappers) are leaves.
func walkFields(md protoreflect.MessageDescriptor, prefix string, seen []protoreflect.FullName, f func(string)) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		path := fd.JSONName()
		if prefix != "" {
			path = prefix + "." + path
		}
		f(path)
		if fd.IsMap() || fd.Message() == nil || leafMessage(fd.Message()) || slices.Contains(seen, fd.Message().FullName()) {
			continue
		}
		walkFields(fd.Message(), path, append(seen, md.FullName()), f)
	}
}

func leafMessage(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// UntranslatedFields are the paths of the fields spec (of kind) sets that
// Canopy does not translate for sidecars, each once, sorted (the top of an
// untranslated subtree only).
func UntranslatedFields(kind string, spec proto.Message) []string {
	var out []string
	setFields(spec.ProtoReflect(), "", func(path string) {
		if subtreeUse(kind, path) != Untranslated || slices.Contains(out, path) {
			return
		}
		// Only the top of an untranslated subtree is named.
		if i := strings.LastIndexByte(path, '.'); i >= 0 && subtreeUse(kind, path[:i]) == Untranslated {
			return
		}
		out = append(out, path)
	})
	slices.Sort(out)
	return out
}

// SetFieldPaths are the paths of every field spec sets, each once, sorted:
// what a fixture covers.
func SetFieldPaths(spec proto.Message) []string {
	var out []string
	setFields(spec.ProtoReflect(), "", func(path string) { out = append(out, path) })
	slices.Sort(out)
	return slices.Compact(out)
}

// setFields calls f with the path of every field m sets, and of the fields
// they set in turn (every element of a list).
func setFields(m protoreflect.Message, prefix string, f func(string)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := fd.JSONName()
		if prefix != "" {
			path = prefix + "." + path
		}
		f(path)
		switch {
		case fd.IsMap() || fd.Message() == nil || leafMessage(fd.Message()):
		case fd.IsList():
			for i := range v.List().Len() {
				setFields(v.List().Get(i).Message(), path, f)
			}
		default:
			setFields(v.Message(), path, f)
		}
		return true
	})
}

// untranslatedProblem says which fields of an object sidecars do not get
// anything of; "" for none.
func untranslatedProblem(kind string, spec proto.Message) string {
	fields := UntranslatedFields(kind, spec)
	if len(fields) == 0 {
		return ""
	}
	return "Canopy does not translate for sidecars: " + strings.Join(fields, ", ")
}
