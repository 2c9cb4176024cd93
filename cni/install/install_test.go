package install

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"
)

const bridge = `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`

func setup(t *testing.T, files map[string]string) Installer {
	t.Helper()
	dir := t.TempDir()
	i := Installer{
		ConfDir: filepath.Join(dir, "net.d"), BinDir: filepath.Join(dir, "bin"), PluginBinary: filepath.Join(dir, "canopy-cni"),
		Entry: map[string]any{"agentSocket": "/var/run/canopy/cni.sock"}, Recheck: 50 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
	}
	for _, d := range []string{i.ConfDir, i.BinDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(i.PluginBinary, []byte("plugin v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(i.ConfDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return i
}

func types(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct{ Type string } `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &conf); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range conf.Plugins {
		out = append(out, p.Type)
	}
	return out
}

func TestInstallJoinsTheChainOnce(t *testing.T) {
	i := setup(t, map[string]string{"10-bridge.conflist": bridge, "99-other.conflist": bridge})
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	primary := filepath.Join(i.ConfDir, "10-bridge.conflist")
	if diff := cmp.Diff([]string{"bridge", "portmap", PluginType}, types(t, primary)); diff != "" {
		t.Errorf("chain (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"bridge", "portmap"}, types(t, filepath.Join(i.ConfDir, "99-other.conflist"))); diff != "" {
		t.Errorf("a non-primary file changed (-want +got):\n%s", diff)
	}
	if b, _ := os.ReadFile(filepath.Join(i.BinDir, PluginType)); string(b) != "plugin v1" {
		t.Errorf("binary = %q", b)
	}
	before, _ := os.Stat(primary)
	time.Sleep(10 * time.Millisecond)
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(primary); !after.ModTime().Equal(before.ModTime()) {
		t.Error("a second Install rewrote the configuration")
	}

	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bridge", "portmap"}, types(t, primary)); diff != "" {
		t.Errorf("after Uninstall (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(i.BinDir, PluginType)); !os.IsNotExist(err) {
		t.Error("binary left after Uninstall")
	}
}

func TestInstallConvertsASingleConf(t *testing.T) {
	i := setup(t, map[string]string{"10-bridge.conf": `{"cniVersion":"1.0.0","name":"k8s","type":"bridge","bridge":"cni0"}`})
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(i.ConfDir, "10-bridge.conf")); !os.IsNotExist(err) {
		t.Error("the .conf was not replaced")
	}
	if diff := cmp.Diff([]string{"bridge", PluginType}, types(t, filepath.Join(i.ConfDir, "10-bridge.conflist"))); diff != "" {
		t.Errorf("chain (-want +got):\n%s", diff)
	}
}

func TestInstallRefusesBadInput(t *testing.T) {
	i := setup(t, map[string]string{"10-bad.conflist": `{"plugins": [`})
	if err := i.Install(); err == nil || !strings.Contains(err.Error(), "(left untouched): not JSON") {
		t.Errorf("Install over a broken file = %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(i.ConfDir, "10-bad.conflist")); string(b) != `{"plugins": [` {
		t.Error("the broken file was changed")
	}
	empty := setup(t, nil)
	if err := empty.Install(); err != ErrNoPrimary {
		t.Errorf("Install without a primary = %v, want ErrNoPrimary", err)
	}
}

// TestWatchPutsItselfBack: another CNI rewrites the file at boot; the
// entry comes back, and a primary that appears late is joined.
func TestWatchPutsItselfBack(t *testing.T) {
	i := setup(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- i.Watch(ctx) }()
	defer func() { cancel(); <-done }()
	primary := filepath.Join(i.ConfDir, "10-bridge.conflist")
	eventuallyChain := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(primary); err == nil && cmp.Equal([]string{"bridge", "portmap", PluginType}, types(t, primary)) {
				return
			}
		}
		t.Fatal(what)
	}
	if err := os.WriteFile(primary, []byte(bridge), 0o644); err != nil {
		t.Fatal(err)
	}
	eventuallyChain("late primary joined")
	if err := os.WriteFile(primary, []byte(bridge), 0o644); err != nil {
		t.Fatal(err)
	}
	eventuallyChain("entry restored after a rewrite")
}

// TestInChain: the plugin is in the chain only once the primary
// configuration ends with its entry and its binary is in place.
func TestInChain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		files   map[string]string
		install bool
		// then changes the node after the install.
		then    func(t *testing.T, i Installer)
		wantErr string
	}{
		{name: "no configuration", wantErr: ErrNoPrimary.Error()},
		{name: "primary without the plugin", files: map[string]string{"10-bridge.conflist": bridge}, wantErr: "does not end with canopy-cni"},
		{name: "installed", files: map[string]string{"10-bridge.conflist": bridge}, install: true},
		{
			name: "another file became primary", files: map[string]string{"10-bridge.conflist": bridge}, install: true,
			then: func(t *testing.T, i Installer) {
				if err := os.WriteFile(filepath.Join(i.ConfDir, "05-other.conflist"), []byte(bridge), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "05-other.conflist does not end with canopy-cni",
		},
		{
			name: "binary gone", files: map[string]string{"10-bridge.conflist": bridge}, install: true,
			then: func(t *testing.T, i Installer) {
				if err := os.Remove(filepath.Join(i.BinDir, PluginType)); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "plugin binary",
		},
		{name: "primary not JSON", files: map[string]string{"10-bridge.conflist": "{"}, wantErr: "not JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			i := setup(t, tt.files)
			if tt.install {
				if err := i.Install(); err != nil {
					t.Fatal(err)
				}
			}
			if tt.then != nil {
				tt.then(t, i)
			}
			err := i.InChain()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("InChain() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// An attack on the primary CNI's file: another vendor's configuration
// that a decode and encode again would change. Its integer above 2^53
// would be rounded (9007199254740993 becomes 9007199254740992), <, > and &
// escaped, "\u00e9" unescaped, keys sorted, its spacing, CRLFs and tabs
// and its missing final newline redone, and the file, 0600 and another
// user's, made 0644 and root's.
const vendorConflist = "{\r\n\t\"name\" : \"k8s-pod-network\",\r\n\t\"cniVersion\":\"0.3.1\",  \"x-vendor\": {\"hash\": \"a<b>&c\", \"z\": [1.50, -0, 1e10]},\r\n\t\"plugins\": [\r\n\t\t{\"type\": \"calico\", \"mtu\": 9007199254740993, \"note\": \"<script>&amp; \\u00e9 é \\u2028\",\r\n\t\t \"ipam\": {\"type\": \"calico-ipam\", \"zz\": 1, \"aa\": 2}},\r\n\t\t{ \"type\":\"portmap\" ,\"snat\":true,\"capabilities\":{\"portMappings\":true}}\r\n\t]  }"

// TestChainingLeavesTheRestAsItWas: Install adds the entry after the last
// primary plugin and changes no other byte of the file, nor its mode or
// owner; Uninstall puts back the file as it was, byte for byte.
func TestChainingLeavesTheRestAsItWas(t *testing.T) {
	t.Parallel()
	// Another user's file, where the test may make one.
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 4242, 4343
	}
	for _, tt := range []struct {
		name, file, content string
		// lastPlugin is the text of the last primary plugin in content,
		// after which the entry goes.
		lastPlugin string
		// converted: the file a single-plugin .conf becomes.
		converted string
		wantTypes []string
	}{
		{
			name: "another vendor's conflist", file: "10-calico.conflist", content: vendorConflist,
			lastPlugin: `{ "type":"portmap" ,"snat":true,"capabilities":{"portMappings":true}}`,
			wantTypes:  []string{"calico", "portmap", PluginType},
		},
		{
			name: "pretty-printed with a final newline", file: "10-flannel.conflist",
			content:    "{\n  \"name\": \"cbr0\",\n  \"cniVersion\": \"0.3.1\",\n  \"plugins\": [\n    {\n      \"type\": \"flannel\",\n      \"delegate\": {\"hairpinMode\": true, \"isDefaultGateway\": true, \"mtu\": 18446744073709551615}\n    }\n  ]\n}\n",
			lastPlugin: "{\n      \"type\": \"flannel\",\n      \"delegate\": {\"hairpinMode\": true, \"isDefaultGateway\": true, \"mtu\": 18446744073709551615}\n    }",
			wantTypes:  []string{"flannel", PluginType},
		},
		{
			name: "a single-plugin .conf", file: "10-bridge.conf", converted: "10-bridge.conflist",
			content:    "  {\"cniVersion\": \"1.0.0\", \"name\": \"k8s\", \"type\": \"bridge\", \"bridge\": \"cni<0>\", \"vlan\": 9007199254740993}\n\n",
			lastPlugin: "{\"cniVersion\": \"1.0.0\", \"name\": \"k8s\", \"type\": \"bridge\", \"bridge\": \"cni<0>\", \"vlan\": 9007199254740993}",
			wantTypes:  []string{"bridge", PluginType},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			i := setup(t, map[string]string{tt.file: tt.content})
			path := filepath.Join(i.ConfDir, tt.file)
			if err := os.Chmod(path, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, uid, gid); err != nil {
				t.Fatal(err)
			}
			want := fileOf(t, path)

			if err := i.Install(); err != nil {
				t.Fatal(err)
			}
			chained := path
			if tt.converted != "" {
				chained = filepath.Join(i.ConfDir, tt.converted)
				if _, err := os.Lstat(path); !os.IsNotExist(err) {
					t.Errorf("%s still there after its conversion: %v", tt.file, err)
				}
			}
			got := fileOf(t, chained)
			if diff := cmp.Diff(want.Mode, got.Mode); diff != "" {
				t.Errorf("mode, uid, gid after Install (-want +got):\n%s", diff)
			}
			// Every byte up to the end of the last primary plugin, and
			// every byte after it, is the file's own.
			end := strings.LastIndex(tt.content, tt.lastPlugin) + len(tt.lastPlugin)
			before, after := tt.content[:end], tt.content[end:]
			if tt.converted != "" {
				// The object, with the spaces around it, is the list's
				// first plugin.
				before, after = tt.content[:end], "]}"+tt.content[end:]
			}
			if !strings.HasSuffix(got.Content, after) || !strings.Contains(got.Content, before) {
				t.Errorf("the primary plugins' bytes changed; the file is now:\n%s", got.Content)
			}
			list, err := libcni.ConfListFromBytes([]byte(got.Content))
			if err != nil {
				t.Fatalf("the runtime cannot load the chained file: %v\n%s", err, got.Content)
			}
			var types []string
			for _, p := range list.Plugins {
				types = append(types, p.Network.Type)
			}
			if diff := cmp.Diff(tt.wantTypes, types); diff != "" {
				t.Errorf("chain (-want +got):\n%s", diff)
			}

			if err := i.Uninstall(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, fileOf(t, path)); diff != "" {
				t.Errorf("after Uninstall, the file (-want +got):\n%s", diff)
			}
			if entries, _ := os.ReadDir(i.ConfDir); len(entries) != 1 {
				t.Errorf("%d files in the configuration directory after Uninstall, want 1", len(entries))
			}
		})
	}
}

// file is what a test compares of a configuration file.
type file struct {
	Content string
	Mode    [3]uint32 // permission bits, uid, gid
}

func fileOf(t *testing.T, path string) file {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	s := st.Sys().(*syscall.Stat_t)
	return file{Content: string(b), Mode: [3]uint32{uint32(st.Mode().Perm()), s.Uid, s.Gid}}
}

// TestInstallLeavesUntouched: what cannot be chained into without
// changing more than the plugin list is refused, naming why, and left as
// it was.
func TestInstallLeavesUntouched(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// make puts the primary configuration at path.
		make    func(t *testing.T, path string)
		wantErr string
		// uninstallOK: nothing of ours to remove, so no error.
		uninstallOK bool
	}{
		{name: "a comment", make: write("{\"plugins\": [{\"type\": \"bridge\"}] // the bridge\n}"), wantErr: "a comment at byte"},
		{name: "a single plugin without a name", make: write(`{"type": "bridge"}`), wantErr: `no "name" string`, uninstallOK: true},
		{name: "larger than a configuration", make: write(`{"plugins": [{"type": "bridge"}], "pad": "` + strings.Repeat("x", 1<<20) + `"}`), wantErr: "larger than"},
		{
			name: "a symbolic link",
			make: func(t *testing.T, path string) {
				target := filepath.Join(t.TempDir(), "calico.conflist")
				write(bridge)(t, target)
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "is a symbolic link",
		},
		{
			name: "a FIFO",
			make: func(t *testing.T, path string) {
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "not a regular file",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			i := setup(t, nil)
			path := filepath.Join(i.ConfDir, "10-primary.conflist")
			tt.make(t, path)
			before := snapshot(t, i.ConfDir)
			if err := i.Install(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Install() = %v, want %q", err, tt.wantErr)
			}
			if err := i.Uninstall(); tt.uninstallOK && err != nil || !tt.uninstallOK && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Uninstall() = %v, want %q", err, tt.wantErr)
			}
			if diff := cmp.Diff(before, snapshot(t, i.ConfDir)); diff != "" {
				t.Errorf("the configuration directory changed (-before +after):\n%s", diff)
			}
		})
	}
}

func write(content string) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot describes each file of dir: its type, and its content or link
// target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = "link to " + target
		case e.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = string(b)
		default:
			out[e.Name()] = e.Type().String()
		}
	}
	return out
}

// TestInstallReplacesOnlyItsEntry: a changed entry (an upgrade's new
// settings) replaces the old one, and nothing else changes.
func TestInstallReplacesOnlyItsEntry(t *testing.T) {
	t.Parallel()
	i := setup(t, map[string]string{"10-calico.conflist": vendorConflist})
	path := filepath.Join(i.ConfDir, "10-calico.conflist")
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	first := fileOf(t, path)
	i.Entry = map[string]any{"agentSocket": "/var/run/canopy/v2.sock", "timeoutSeconds": 30}
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if err := i.InChain(); err != nil {
		t.Errorf("InChain() after the new entry = %v", err)
	}
	second := fileOf(t, path)
	want := strings.Replace(first.Content, `"agentSocket": "/var/run/canopy/cni.sock",`, `"agentSocket": "/var/run/canopy/v2.sock",`+"\r\n\t\t\t"+`"timeoutSeconds": 30,`, 1)
	if diff := cmp.Diff(want, second.Content); diff != "" {
		t.Errorf("after the entry changed (-want +got):\n%s", diff)
	}
	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if got := fileOf(t, path).Content; got != vendorConflist {
		t.Errorf("after Uninstall:\n%q\nwant\n%q", got, vendorConflist)
	}
}
