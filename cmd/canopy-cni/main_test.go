package main_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/cni/pluginevent"
)

// agent is a stand-in node agent on a unix socket: it records requests
// and answers with fail when set.
type agent struct {
	socket string
	mu     sync.Mutex
	got    []string
	fail   string
}

func newAgent(t *testing.T) *agent {
	a := &agent{socket: filepath.Join(t.TempDir(), "cni.sock")}
	l, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req pluginevent.Request
		_ = json.NewDecoder(r.Body).Decode(&req)
		a.mu.Lock()
		a.got = append(a.got, r.URL.Path+" "+req.PodNamespace+"/"+req.PodName+" "+strings.Join(req.IPs, ","))
		fail := a.fail
		a.mu.Unlock()
		if fail != "" {
			http.Error(w, fail, http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(pluginevent.Response{Enrolled: true})
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return a
}

var plugin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "canopy-cni-test")
	if err != nil {
		panic(err)
	}
	plugin = filepath.Join(dir, "canopy-cni")
	if out, err := exec.Command("go", "build", "-o", plugin, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.244.1.7/24","interface":0}]}`

func conf(socket string, prev bool) string {
	c := `{"cniVersion":"1.0.0","name":"k8s","type":"canopy-cni","agentSocket":"` + socket + `"`
	if prev {
		c += `,"prevResult":` + prevResult
	}
	return c + "}"
}

func run(t *testing.T, command, stdin, args string) (string, error) {
	t.Helper()
	cmd := exec.Command(plugin)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=c1", "CNI_NETNS=/var/run/netns/x", "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "CNI_ARGS=" + args}
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	return string(out), err
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME=echo;K8S_POD_INFRA_CONTAINER_ID=c1"

// TestPluginBinary runs the built plugin as a runtime would.
func TestPluginBinary(t *testing.T) {
	a := newAgent(t)

	out, err := run(t, "ADD", conf(a.socket, true), podArgs)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	var got, want map[string]any
	_ = json.Unmarshal([]byte(out), &got)
	_ = json.Unmarshal([]byte(prevResult), &want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ADD did not pass prevResult through (-want +got):\n%s", diff)
	}
	if _, err := run(t, "CHECK", conf(a.socket, true), podArgs); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	for range 2 {
		if _, err := run(t, "DEL", conf(a.socket, false), podArgs); err != nil {
			t.Errorf("DEL: %v", err)
		}
	}
	if diff := cmp.Diff([]string{"/cmdadd apps/echo 10.244.1.7", "/cmdcheck apps/echo 10.244.1.7", "/cmddel apps/echo ", "/cmddel apps/echo "}, a.got); diff != "" {
		t.Errorf("agent saw (-want +got):\n%s", diff)
	}

	// Fail closed: the agent's refusal fails ADD, with its reason.
	a.fail = "no route into the pod's netns"
	var cniErr struct{ Msg string }
	out, err = run(t, "ADD", conf(a.socket, true), podArgs)
	if _ = json.Unmarshal([]byte(out), &cniErr); err == nil || !strings.Contains(cniErr.Msg, "no route into the pod's netns") {
		t.Errorf("ADD with a failing agent = %v %q, want a CNI error with the agent's reason", err, out)
	}
	// An agent that is not there fails ADD too, but not DEL.
	gone := conf(filepath.Join(t.TempDir(), "none.sock"), true)
	if _, err := run(t, "ADD", gone, podArgs); err == nil {
		t.Error("ADD without an agent succeeded")
	}
	if _, err := run(t, "DEL", gone, podArgs); err != nil {
		t.Errorf("DEL without an agent: %v", err)
	}
	// Excluded namespaces pass without asking.
	if _, err := run(t, "ADD", gone, "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns"); err != nil {
		t.Errorf("ADD in kube-system without an agent: %v", err)
	}
}

func TestPluginRejectsBadConfig(t *testing.T) {
	for _, tt := range []struct{ name, conf, want string }{
		{"not JSON", "{", "network config"},
		{"no prevResult", conf("/x.sock", false), "must be chained after"},
		{"negative timeout", `{"cniVersion":"1.0.0","name":"k","type":"canopy-cni","timeoutSeconds":-1}`, "negative"},
		{"old version", `{"cniVersion":"0.3.1","name":"k","type":"canopy-cni","prevResult":` + prevResult + `}`, "version"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(t, "ADD", tt.conf, podArgs)
			if err == nil || !strings.Contains(strings.ToLower(out), strings.ToLower(tt.want)) {
				t.Errorf("ADD = %v %s, want an error mentioning %q", err, out, tt.want)
			}
		})
	}
}
