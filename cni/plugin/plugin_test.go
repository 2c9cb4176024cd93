package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/cni/plugin"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
)

// envRunPlugin makes the test binary run as the canopy-cni binary, the way
// the container runtime execs it: CNI_* variables, the configuration on
// stdin, the result or error on stdout.
const envRunPlugin = "CANOPY_TEST_RUN_AS_CNI_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunPlugin) == "1" {
		// As cmd/canopy-cni/main.go.
		skel.PluginMainFuncs(plugin.Plugin{}.Funcs(), version.PluginSupports("1.0.0", "1.1.0"), "canopy-cni test")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// prevResult is what the interface plugin before canopy-cni returned.
const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/pod"}],` +
	`"ips":[{"interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"},{"interface":0,"address":"fd00::5/64"}],` +
	`"routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["10.96.0.10"],"search":["apps.svc.cluster.local"]}}`

// conf returns a network configuration as a runtime passes it, with extra
// JSON members (`"key":value` text) appended.
func conf(extra ...string) string {
	members := append([]string{`"cniVersion":"1.0.0"`, `"name":"pods"`, `"type":"canopy-cni"`}, extra...)
	return "{" + strings.Join(members, ",") + "}"
}

// summary is what a test checks of a parsed configuration.
type summary struct {
	CNIVersion, Name, Type string
	AgentSocket            string
	ExcludeNamespaces      []string
	TimeoutSeconds         int
	PrevIPs                []string
}

func summarize(t *testing.T, c *plugin.Conf) summary {
	t.Helper()
	s := summary{CNIVersion: c.CNIVersion, Name: c.Name, Type: c.Type, AgentSocket: c.AgentSocket,
		ExcludeNamespaces: c.ExcludeNamespaces, TimeoutSeconds: c.TimeoutSeconds}
	if c.PrevResult != nil {
		r, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			t.Fatalf("prevResult: %v", err)
		}
		for _, ip := range r.IPs {
			s.PrevIPs = append(s.PrevIPs, ip.Address.String())
		}
	}
	return s
}

func TestParseConf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		stdin   string
		want    summary
		wantErr string
	}{
		{
			name:  "defaults",
			stdin: conf(),
			want:  summary{CNIVersion: "1.0.0", Name: "pods", Type: "canopy-cni", ExcludeNamespaces: []string{"kube-system"}},
		},
		{
			name:  "every field",
			stdin: conf(`"agentSocket":"/run/a.sock"`, `"excludeNamespaces":["kube-system","infra"]`, `"timeoutSeconds":5`),
			want: summary{CNIVersion: "1.0.0", Name: "pods", Type: "canopy-cni", AgentSocket: "/run/a.sock",
				ExcludeNamespaces: []string{"kube-system", "infra"}, TimeoutSeconds: 5},
		},
		{
			name:  "explicitly no excluded namespaces",
			stdin: conf(`"excludeNamespaces":[]`),
			want:  summary{CNIVersion: "1.0.0", Name: "pods", Type: "canopy-cni", ExcludeNamespaces: []string{}},
		},
		{
			name:  "null excluded namespaces take the default",
			stdin: conf(`"excludeNamespaces":null`),
			want:  summary{CNIVersion: "1.0.0", Name: "pods", Type: "canopy-cni", ExcludeNamespaces: []string{"kube-system"}},
		},
		{
			name:  "prevResult",
			stdin: conf(`"prevResult":` + prevResult),
			want: summary{CNIVersion: "1.0.0", Name: "pods", Type: "canopy-cni", ExcludeNamespaces: []string{"kube-system"},
				PrevIPs: []string{"10.244.1.5/24", "fd00::5/64"}},
		},
		{
			name:  "prevResult converted to the configuration's version",
			stdin: `{"cniVersion":"1.1.0","name":"pods","type":"canopy-cni","prevResult":` + strings.Replace(prevResult, `"1.0.0"`, `"1.1.0"`, 1) + `}`,
			want: summary{CNIVersion: "1.1.0", Name: "pods", Type: "canopy-cni", ExcludeNamespaces: []string{"kube-system"},
				PrevIPs: []string{"10.244.1.5/24", "fd00::5/64"}},
		},
		{
			// The runtime checks name and type; the plugin needs neither.
			name:  "no name or type",
			stdin: `{"cniVersion":"1.0.0"}`,
			want:  summary{CNIVersion: "1.0.0", ExcludeNamespaces: []string{"kube-system"}},
		},
		{name: "empty", stdin: ``, wantErr: "parse network configuration"},
		{name: "not JSON", stdin: `cniVersion: 1.0.0`, wantErr: "parse network configuration"},
		{name: "truncated", stdin: conf()[:20], wantErr: "parse network configuration"},
		{name: "array", stdin: `[]`, wantErr: "parse network configuration"},
		{name: "timeout as a string", stdin: conf(`"timeoutSeconds":"5"`), wantErr: "parse network configuration"},
		{name: "excluded namespaces as a string", stdin: conf(`"excludeNamespaces":"kube-system"`), wantErr: "parse network configuration"},
		{name: "negative timeout", stdin: conf(`"timeoutSeconds":-1`), wantErr: "timeoutSeconds -1 is negative"},
		{name: "prevResult not an object", stdin: conf(`"prevResult":"10.244.1.5"`), wantErr: "parse network configuration"},
		{name: "prevResult with a bad address", stdin: conf(`"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.244.1.500/24"}]}`), wantErr: "parse prevResult"},
		{name: "prevResult with ips not a list", stdin: conf(`"prevResult":{"cniVersion":"1.0.0","ips":{"address":"10.244.1.5/24"}}`), wantErr: "parse prevResult"},
		{name: "prevResult of an unknown version", stdin: conf(`"prevResult":{"cniVersion":"9.9.9","ips":[]}`), wantErr: "parse prevResult"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := plugin.ParseConf([]byte(tt.stdin))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "canopy-cni: ") {
					t.Fatalf("ParseConf() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseConf() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, summarize(t, c)); diff != "" {
				t.Errorf("ParseConf() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzParseConf: the configuration comes from files on the node and from
// the runtime; whatever it holds, ParseConf returns an error or a usable
// configuration, never panics.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		conf(),
		conf(`"agentSocket":"/run/a.sock"`, `"excludeNamespaces":["kube-system","infra"]`, `"timeoutSeconds":5`),
		conf(`"prevResult":` + prevResult),
		conf(`"prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.1/32"}]}`),
		conf(`"prevResult":{}`),
		conf(`"prevResult":null`, `"excludeNamespaces":null`),
		`{"prevResult":{"ips":[{"address":"::1/128","interface":-1}]}}`,
		`{}`, `[]`, `null`, ``, `{"timeoutSeconds":-1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		c, err := plugin.ParseConf(stdin)
		if err != nil {
			if c != nil {
				t.Errorf("ParseConf() = %+v with error %v", c, err)
			}
			return
		}
		if c.TimeoutSeconds < 0 {
			t.Errorf("accepted timeoutSeconds %d", c.TimeoutSeconds)
		}
		if c.ExcludeNamespaces == nil {
			t.Error("ExcludeNamespaces left nil")
		}
		if c.RawPrevResult != nil && c.PrevResult == nil {
			t.Error("a prevResult was given but not parsed")
		}
		if c.PrevResult != nil {
			// What ADD reads of it must not fail or panic either.
			if _, err := current.NewResultFromResult(c.PrevResult); err != nil {
				t.Logf("prevResult cannot be converted (ADD fails on it): %v", err)
			}
		}
	})
}

// agent is a node agent on a unix socket: it records requests and answers
// with answer.
type agent struct {
	socket string
	answer func(w http.ResponseWriter, r *http.Request)

	mu   sync.Mutex
	reqs []call
}

// call is one request the agent received.
type call struct {
	Path string
	Req  pluginevent.Request
}

// answers for the agent.
var (
	enrolled    = jsonAnswer(pluginevent.Response{Enrolled: true})
	notEnrolled = jsonAnswer(pluginevent.Response{Enrolled: false, Reason: "namespace not in ambient mode"})
	refuses     = func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "cannot enroll pod: netns gone", http.StatusInternalServerError)
	}
	garbage = func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>proxy error</html>")) }
)

func jsonAnswer(resp pluginevent.Response) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// shortDir is a temporary directory with a path short enough for a unix
// socket (t.TempDir's can pass the 108-byte limit with long test names).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cnp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startAgent serves answer on a socket until the test ends; a nil answer
// leaves the socket path unbound (the agent is down).
func startAgent(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *agent {
	t.Helper()
	a := &agent{socket: filepath.Join(shortDir(t), "cni.sock"), answer: answer}
	if answer == nil {
		return a
	}
	a.serve(t)
	return a
}

// serve binds the agent's socket and answers on it until the test ends.
func (a *agent) serve(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req pluginevent.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.reqs = append(a.reqs, call{Path: r.URL.Path, Req: req})
		a.mu.Unlock()
		a.answer(w, r)
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })
}

func (a *agent) calls() []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]call(nil), a.reqs...)
}

// invocation is one exec of the plugin.
type invocation struct {
	command string
	// args is CNI_ARGS; empty means a pod's, as the kubelet's runtime sets.
	args  string
	stdin string
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME=echo-0;K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=uid-1"

// run execs the plugin and returns its stdout and whether it succeeded.
func run(t *testing.T, inv invocation) (stdout []byte, ok bool) {
	t.Helper()
	if inv.args == "" {
		inv.args = podArgs
	}
	// A plugin that outlives its configured timeout (at most a few
	// seconds here) is killed and the test sees no CNI answer.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), envRunPlugin+"=1",
		"CNI_COMMAND="+inv.command, "CNI_CONTAINERID=c0ffee", "CNI_NETNS=/var/run/netns/pod",
		"CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "CNI_ARGS="+inv.args)
	cmd.Stdin = strings.NewReader(inv.stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("exec plugin: %v", err)
	}
	if errOut.Len() > 0 {
		t.Logf("plugin stderr: %s", errOut.Bytes())
	}
	return out.Bytes(), err == nil
}

// wantPod is the request the agent gets for podArgs and prevResult.
var wantPod = pluginevent.Request{ContainerID: "c0ffee", Netns: "/var/run/netns/pod", PodName: "echo-0", PodNamespace: "apps",
	PodUID: "uid-1", IPs: []string{"10.244.1.5", "fd00::5"}}

// TestAdd: ADD asks the agent and passes the previous result through; it
// fails closed, with a CNI error naming the pod, whenever the agent does
// not say the pod is done: down, erring, answering nonsense or too slow.
// The one exception is an agent that cannot be reached (down, or not
// synced yet) while its namespace record says the pod's namespace is
// outside the mesh: such a pod starts, so that an agent that is down
// blocks only the pods it would have enrolled.
func TestAdd(t *testing.T) {
	t.Parallel()
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	notSynced := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "node agent not synced with the cluster yet", http.StatusServiceUnavailable)
	}
	outside := `{"version":1,"outsideMesh":["apps","other"]}`
	// An agent that cannot be reached is asked again until the timeout.
	short := []string{`"timeoutSeconds":1`}
	for _, tt := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		args   string
		extra  []string
		noPrev bool
		// record, if set, is the agent's namespace record (the file's
		// content; "missing" names a file that does not exist).
		record string
		// wantCalls are the agent's requests; wantErr, if set, is in the
		// error message on stdout, else the output is prevResult.
		wantCalls []call
		wantErr   string
	}{
		{name: "enrolled", answer: enrolled, wantCalls: []call{{pluginevent.PathAdd, wantPod}}},
		{name: "outside the mesh", answer: notEnrolled, wantCalls: []call{{pluginevent.PathAdd, wantPod}}},
		{name: "excluded namespace, agent down", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0"},
		{name: "not a pod, agent down", args: "IgnoreUnknown=1"},
		{name: "agent down", extra: short, wantErr: "canopy-cni: pod apps/echo-0: still unreachable after 1s: node agent at"},
		{name: "agent refuses", answer: refuses, wantCalls: []call{{pluginevent.PathAdd, wantPod}}, wantErr: "canopy-cni: pod apps/echo-0: node agent: cannot enroll pod: netns gone"},
		{name: "agent answers nonsense", answer: garbage, wantCalls: []call{{pluginevent.PathAdd, wantPod}}, wantErr: "node agent answered"},
		{name: "agent too slow", answer: hang, extra: []string{`"timeoutSeconds":1`}, wantCalls: []call{{pluginevent.PathAdd, wantPod}}, wantErr: "did not answer within 1s"},
		{name: "no prevResult", answer: enrolled, noPrev: true, wantErr: "no prevResult"},
		{name: "bad CNI_ARGS", answer: enrolled, args: "K8S_POD_NAME=echo-0;UNKNOWN=1", wantErr: "canopy-cni: CNI_ARGS"},
		{name: "bad configuration", answer: enrolled, extra: []string{`"timeoutSeconds":-5`}, wantErr: "negative"},
		{name: "agent down, namespace outside the mesh", record: outside},
		{name: "agent not synced, namespace outside the mesh", answer: notSynced, record: outside, wantCalls: []call{{pluginevent.PathAdd, wantPod}}},
		{name: "agent down, namespace in the mesh", extra: short, record: `{"version":1,"outsideMesh":["other"]}`, wantErr: "canopy-cni: pod apps/echo-0: still unreachable after 1s"},
		{name: "agent down, nothing outside the mesh", extra: short, record: `{"version":1,"outsideMesh":[]}`, wantErr: "node agent at"},
		{name: "agent down, no record", extra: short, record: "missing", wantErr: "node agent at"},
		{name: "agent down, damaged record", extra: short, record: `{"version":1,"outsideMesh":["apps"`, wantErr: "node agent at"},
		{name: "agent down, record of an unknown version", extra: short, record: `{"version":2,"outsideMesh":["apps"]}`, wantErr: "node agent at"},
		{name: "agent down, record not an object", extra: short, record: `["apps"]`, wantErr: "node agent at"},
		// An agent that answers is obeyed, whatever the record says.
		{name: "agent refuses, namespace outside the mesh", answer: refuses, record: outside, wantCalls: []call{{pluginevent.PathAdd, wantPod}}, wantErr: "netns gone"},
		{name: "agent too slow, namespace outside the mesh", answer: hang, record: outside, extra: []string{`"timeoutSeconds":1`}, wantCalls: []call{{pluginevent.PathAdd, wantPod}}, wantErr: "did not answer within 1s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := startAgent(t, tt.answer)
			members := append([]string{`"agentSocket":"` + a.socket + `"`}, tt.extra...)
			if tt.record != "" {
				path := filepath.Join(t.TempDir(), "namespaces.json")
				if tt.record != "missing" {
					if err := os.WriteFile(path, []byte(tt.record), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				members = append(members, `"namespaceRecord":"`+path+`"`)
			}
			if !tt.noPrev {
				members = append(members, `"prevResult":`+prevResult)
			}
			out, ok := run(t, invocation{command: "ADD", args: tt.args, stdin: conf(members...)})
			if diff := cmp.Diff(tt.wantCalls, a.calls()); diff != "" {
				t.Errorf("agent requests (-want +got):\n%s", diff)
			}
			if tt.wantErr != "" {
				var e types.Error
				if ok || json.Unmarshal(out, &e) != nil || !strings.Contains(e.Msg, tt.wantErr) {
					t.Errorf("ADD succeeded = %v with output %s, want a CNI error containing %q", ok, out, tt.wantErr)
				}
				return
			}
			if !ok {
				t.Fatalf("ADD failed: %s", out)
			}
			checkPassedThrough(t, out)
		})
	}
}

// TestAddWaitsForANewAgent: a pod created while the agent is being
// replaced (its socket gone for a moment, as in a DaemonSet upgrade) waits
// for the new agent and starts enrolled, instead of failing its ADD.
func TestAddWaitsForANewAgent(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	a.answer = enrolled
	go func() {
		time.Sleep(1500 * time.Millisecond)
		a.serve(t)
	}()
	stdin := conf(`"agentSocket":"`+a.socket+`"`, `"timeoutSeconds":10`, `"prevResult":`+prevResult)
	out, ok := run(t, invocation{command: "ADD", stdin: stdin})
	if !ok {
		t.Fatalf("ADD failed while the new agent came up: %s", out)
	}
	checkPassedThrough(t, out)
	if diff := cmp.Diff([]call{{pluginevent.PathAdd, wantPod}}, a.calls()); diff != "" {
		t.Errorf("agent requests (-want +got):\n%s", diff)
	}
}

// checkPassedThrough checks that out is prevResult, unchanged.
func checkPassedThrough(t *testing.T, out []byte) {
	t.Helper()
	var got, want any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("ADD output %q: %v", out, err)
	}
	if err := json.Unmarshal([]byte(prevResult), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ADD output is not prevResult (-want +got):\n%s", diff)
	}
}

// TestDel: DEL tells the agent and always succeeds, whatever the agent
// does, and again when repeated.
func TestDel(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		answer    func(w http.ResponseWriter, r *http.Request)
		args      string
		wantCalls int
	}{
		{name: "agent answers", answer: enrolled, wantCalls: 2},
		{name: "agent refuses", answer: refuses, wantCalls: 2},
		{name: "agent down"},
		{name: "excluded namespace", answer: enrolled, args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0"},
		{name: "bad CNI_ARGS", answer: enrolled, args: "K8S_POD_NAME=echo-0;UNKNOWN=1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := startAgent(t, tt.answer)
			// The runtime may not have a prevResult for DEL.
			stdin := conf(`"agentSocket":"` + a.socket + `"`)
			for i := range 2 {
				if out, ok := run(t, invocation{command: "DEL", args: tt.args, stdin: stdin}); !ok || len(out) > 0 {
					t.Errorf("DEL #%d: succeeded = %v, output %q; want success and no output", i+1, ok, out)
				}
			}
			calls := a.calls()
			if len(calls) != tt.wantCalls {
				t.Fatalf("agent got %d requests, want %d: %v", len(calls), tt.wantCalls, calls)
			}
			for _, c := range calls {
				want := call{pluginevent.PathDel, wantPod}
				want.Req.IPs = nil
				if diff := cmp.Diff(want, c); diff != "" {
					t.Errorf("DEL request (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestCheck: CHECK asks the agent and fails with it.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		answer     func(w http.ResponseWriter, r *http.Request)
		args       string
		noPrev     bool
		wantCalled bool
		wantOK     bool
	}{
		{name: "agent says fine", answer: enrolled, wantCalled: true, wantOK: true},
		{name: "agent refuses", answer: refuses, wantCalled: true},
		{name: "agent down"},
		{name: "excluded namespace", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0", wantOK: true},
		{name: "no prevResult", answer: enrolled, noPrev: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := startAgent(t, tt.answer)
			members := []string{`"agentSocket":"` + a.socket + `"`}
			if !tt.noPrev {
				members = append(members, `"prevResult":`+prevResult)
			}
			out, ok := run(t, invocation{command: "CHECK", args: tt.args, stdin: conf(members...)})
			if ok != tt.wantOK {
				t.Errorf("CHECK succeeded = %v (output %s), want %v", ok, out, tt.wantOK)
			}
			var want []call
			if tt.wantCalled {
				want = []call{{pluginevent.PathCheck, wantPod}}
			}
			if diff := cmp.Diff(want, a.calls()); diff != "" {
				t.Errorf("agent requests (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVersions: the runtime's version query and an unsupported version
// are answered by skel, before the plugin runs.
func TestVersions(t *testing.T) {
	t.Parallel()
	out, ok := run(t, invocation{command: "VERSION", stdin: `{"cniVersion":"1.0.0"}`})
	var vi struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if !ok || json.Unmarshal(out, &vi) != nil {
		t.Fatalf("VERSION: succeeded = %v, output %s", ok, out)
	}
	if diff := cmp.Diff([]string{"1.0.0", "1.1.0"}, vi.SupportedVersions); diff != "" {
		t.Errorf("supported versions (-want +got):\n%s", diff)
	}
	a := startAgent(t, enrolled)
	old := `{"cniVersion":"0.4.0","name":"pods","type":"canopy-cni","agentSocket":"` + a.socket + `","prevResult":{"cniVersion":"0.4.0","ips":[]}}`
	if _, ok := run(t, invocation{command: "ADD", stdin: old}); ok {
		t.Error("ADD of CNI 0.4.0 succeeded")
	}
	if len(a.calls()) > 0 {
		t.Error("the agent was asked about a CNI 0.4.0 ADD")
	}
}
