// Package deprules holds Canopy's dependency rules as data and a test that
// checks every package of the module, and every binary under cmd/, against
// them with go list. The rules keep binaries small and components swappable:
// the node proxy never links the control plane or client-go, the CNI plugin
// (exec'd on every pod start) never links client-go or gRPC, nothing links a
// test helper, and nothing imports istio.io/istio.
//
// A new binary under cmd/ fails the test until it is listed in Binaries.
package deprules

import "strings"

// Module is the module path; rule paths that start with "./" are relative
// to it.
const Module = "github.com/canopy-mesh/canopy"

// Rule forbids packages matching Packages to depend (directly or not) on any
// import path matching Forbid. Patterns are import path prefixes; "./x"
// means Module + "/x", and a pattern matches the path itself and everything
// below it.
type Rule struct {
	Packages []string
	// Except are packages that Packages matches but the rule spares.
	Except []string
	Forbid []string
	// Allow, when not empty, turns the rule into an allowlist: besides the
	// standard library, only paths matching Allow may be dependencies.
	Allow  []string
	Reason string
}

// Binaries are the commands under cmd/, each with the rules that apply only
// to it. Binaries land with the issue that gives them a job.
var Binaries = map[string][]Rule{
	"canopy-controller": {{
		Packages: []string{"./cmd/canopy-controller"},
		Forbid:   []string{"./node", "./cni", "./localcluster"},
		Reason:   "the control plane links no data-plane or development code",
	}},
	// The local cluster runs components as processes; it must not link
	// them, or it would hide their dependency problems.
	"canopy-local": {{
		Packages: []string{"./cmd/canopy-local"},
		Forbid:   []string{"./controller", "./ca", "./cni", "./node"},
		Reason:   "the local cluster runs Canopy's binaries, it does not link them",
	}},
	// The container runtime execs the plugin on every pod start: it stays
	// small and fast to load.
	"canopy-cni": {{
		Packages: []string{"./cmd/canopy-cni"},
		Forbid:   []string{"k8s.io/client-go", "k8s.io/apimachinery", "google.golang.org/grpc", "./controller", "./node", "./cni/redirect", "./cni/zds"},
		Reason:   "the CNI plugin links neither client-go nor gRPC nor the agent's machinery",
	}},
	"canopy-cni-agent": {{
		Packages: []string{"./cmd/canopy-cni-agent"},
		Forbid:   []string{"./controller", "./node", "./localcluster"},
		Reason:   "the CNI agent talks to the node proxy over ZDS only",
	}},
	"canopy-node": {{
		Packages: []string{"./cmd/canopy-node"},
		Forbid:   []string{"./controller", "./cni", "./ca", "k8s.io/client-go", "./localcluster"},
		Reason:   "the node proxy learns everything over xDS, ZDS and the CA API",
	}},
	// canopyctl reads the components' JSON views through the API server;
	// it links none of their machinery (node/configdump holds the view types).
	"canopyctl": {{
		Packages: []string{"./cmd/canopyctl"},
		Forbid: []string{"./controller", "./ca", "./cni", "./localcluster", "./node/proxy", "./node/hbone",
			"./node/inpod", "./node/zdsclient", "./node/caclient"},
		Reason: "canopyctl is a client of the API server and the components' HTTP views",
	}},
	// The test application runs in every demo pod: an application, not a
	// mesh component. Its gRPC mode uses grpc-go's own xDS support as a
	// proxyless application does, never Canopy's machinery.
	"canopy-echo": {{
		Packages: []string{"./cmd/canopy-echo"},
		Forbid:   []string{"k8s.io", "./workloadapi", "./controller", "./node", "./cni", "./ca"},
		Reason:   "the test app is an application of the mesh (HTTP, TCP, proxyless gRPC), not part of it",
	}},
	// Every pod's first process on the local cluster's real nodes: the
	// standard library only, so it starts in no time and holds nothing.
	"canopy-pause": {{
		Packages: []string{"./cmd/canopy-pause"},
		Allow:    []string{"./cmd/canopy-pause"},
		Reason:   "the sandbox process links nothing but the standard library",
	}},
}

// Rules apply to every package of the module they match.
var Rules = []Rule{
	{
		Packages: []string{"./"},
		Forbid:   []string{"istio.io/istio"},
		Reason:   "Canopy reads Istio's APIs through istio.io/api and istio.io/client-go only",
	},
	{
		Packages: []string{"./"},
		// Test helpers live below internal/testing, so a new one is
		// covered without a change here. The local cluster is a
		// development tool built on the test environment; Canopy's own
		// components never link either.
		Except: []string{"./internal/testing", "./localcluster", "./cmd/canopy-local"},
		Forbid: []string{"./internal/testing"},
		Reason: "test helpers are for tests only",
	},
	{
		Packages: []string{"./"},
		// Outside internal/ since it is a tool of its own beside e2e/;
		// this rule keeps it out of everything but its binary.
		Except: []string{"./localcluster", "./cmd/canopy-local"},
		Forbid: []string{"./localcluster"},
		Reason: "the local cluster is a development tool; only canopy-local links it",
	},
	{
		Packages: []string{"./"},
		Forbid:   []string{"./cmd"},
		Reason:   "nothing imports a main package; cmd/ is wiring only",
	},
	{
		Packages: []string{"./workloadapi"},
		Allow:    []string{"./workloadapi", "google.golang.org/protobuf", "github.com/spiffe/go-spiffe/v2/spiffeid"},
		Reason:   "every binary links the wire types, so they stay dependency-free",
	},
	{
		Packages: []string{"./node"},
		Forbid:   []string{"./controller", "./cni", "k8s.io/client-go"},
		Reason:   "the node proxy learns everything over xDS, ZDS and the CA API",
	},
	{
		Packages: []string{"./ca"},
		Forbid:   []string{"./controller", "./node", "./cni"},
		Reason:   "the CA is a component of its own; the controller uses it through interfaces",
	},
	{
		Packages: []string{"./cni"},
		Forbid:   []string{"./controller", "./node"},
		Reason:   "the CNI agent talks to the node proxy over ZDS only",
	},
}

// expand turns a "./x" pattern into a full import path.
func expand(pattern string) string {
	if rest, ok := strings.CutPrefix(pattern, "./"); ok {
		if rest == "" {
			return Module
		}
		return Module + "/" + rest
	}
	return pattern
}

// matches reports whether path is pattern or below it.
func matches(path, pattern string) bool {
	p := expand(pattern)
	return path == p || strings.HasPrefix(path, p+"/")
}
