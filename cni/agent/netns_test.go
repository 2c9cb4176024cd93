package agent

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

func TestPodUIDFromCgroup(t *testing.T) {
	t.Parallel()
	const uid = "0b6b1ad2-54c8-4b1e-9d3c-3f2c5d8e7a10"
	const uscore = "0b6b1ad2_54c8_4b1e_9d3c_3f2c5d8e7a10"
	const other = "5a5a5a5a-1111-2222-3333-444455556666"
	type result struct {
		UID types.UID
		OK  bool
	}
	for _, tt := range []struct {
		name    string
		content string
		want    result
	}{
		{
			name:    "cgroup v2, cgroupfs driver",
			content: "0::/kubepods/burstable/pod" + uid + "/0123abcd\n",
			want:    result{uid, true},
		},
		{
			name:    "cgroup v2, cgroupfs driver, guaranteed",
			content: "0::/kubepods/pod" + uid + "/0123abcd\n",
			want:    result{uid, true},
		},
		{
			name:    "cgroup v2, systemd driver",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uscore + ".slice/cri-containerd-0123.scope\n",
			want:    result{uid, true},
		},
		{
			name:    "cgroup v2, systemd driver, guaranteed",
			content: "0::/kubepods.slice/kubepods-pod" + uscore + ".slice/cri-containerd-0123.scope\n",
			want:    result{uid, true},
		},
		{
			name:    "seen from another cgroup namespace",
			content: "0::/../../kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uscore + ".slice/crio-0123.scope\n",
			want:    result{uid, true},
		},
		{
			name:    "under a parent, as the local cluster runs pods",
			content: "0::/canopy-local-e2e/node-1/kubepods/pod" + uid + "\n",
			want:    result{uid, true},
		},
		{
			name: "cgroup v1 controllers agree",
			content: "12:memory:/kubepods/besteffort/pod" + uid + "/0123\n" +
				"11:cpu,cpuacct:/kubepods/besteffort/pod" + uid + "/0123\n" +
				"1:name=systemd:/kubepods/besteffort/pod" + uid + "/0123\n",
			want: result{uid, true},
		},
		{
			name: "hybrid host: v1 controllers at the root, the pod in v2",
			content: "9:name=systemd:/\n4:memory:/\n1:cpu:/\n" +
				"0::/canopy-local-e2e/node-1/kubepods/pod" + uid + "\n",
			want: result{uid, true},
		},
		{
			// A process with CAP_SYS_ADMIN can mount a named v1 hierarchy
			// and make up any path in it.
			name:    "only a named v1 hierarchy names the pod",
			content: "1:name=impostor:/kubepods/pod" + uid + "\n0::/kubepods/pod" + other + "\n",
			want:    result{other, true},
		},
		{
			name:    "only a named v1 hierarchy",
			content: "1:name=impostor:/kubepods/pod" + uid + "\n0::/\n",
		},
		{
			// Below its own cgroup a pod may name cgroups as it likes.
			name:    "a pod's delegated subtree names another pod",
			content: "0::/kubepods/burstable/pod" + other + "/0123/kubepods/pod" + uid + "\n",
			want:    result{other, true},
		},
		{
			name:    "controllers disagree",
			content: "4:memory:/kubepods/pod" + uid + "\n0::/kubepods/pod" + other + "\n",
		},
		{name: "not a pod", content: "0::/system.slice/containerd.service\n"},
		{name: "pod outside kubepods", content: "0::/user.slice/pod" + uid + "\n"},
		{name: "kubepods but no pod", content: "0::/kubepods/burstable\n"},
		{name: "not a UID", content: "0::/kubepods/podnotauid\n"},
		{name: "upper-case UID", content: "0::/kubepods/pod0B6B1AD2-54C8-4B1E-9D3C-3F2C5D8E7A10\n"},
		{name: "UID with a path in it", content: "0::/kubepods/pod../../../etc/passwd-aaaa-bbbb-cccc-dddd\n"},
		{name: "systemd slice without a UID", content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice\n"},
		{name: "empty", content: ""},
		{name: "garbage", content: "::::\n0\n:\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got result
			got.UID, got.OK = podUIDFromCgroup(tt.content)
			if !got.OK {
				got.UID = ""
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("podUIDFromCgroup(%q) mismatch (-want +got):\n%s", tt.content, diff)
			}
		})
	}
}

// FuzzPodUIDFromCgroup: /proc/<pid>/cgroup of any process on the node is
// read; whatever it holds, the answer is a UID or nothing.
func FuzzPodUIDFromCgroup(f *testing.F) {
	f.Add("0::/kubepods/burstable/pod0b6b1ad2-54c8-4b1e-9d3c-3f2c5d8e7a10/0123\n")
	f.Add("0::/kubepods.slice/kubepods-pod0b6b1ad2_54c8_4b1e_9d3c_3f2c5d8e7a10.slice/x.scope\n")
	f.Add("12:memory:/kubepods/pod\n1:name=systemd:/\n")
	f.Fuzz(func(t *testing.T, content string) {
		uid, ok := podUIDFromCgroup(content)
		if ok && !isUID(string(uid)) {
			t.Errorf("podUIDFromCgroup(%q) = %q, not a UID", content, uid)
		}
	})
}
