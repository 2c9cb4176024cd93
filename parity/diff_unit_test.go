package parity

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/workloadapi"
)

func TestFieldDiffs(t *testing.T) {
	t.Parallel()
	svcKey := "apps/web.apps.svc.cluster.local"
	base := func() *workloadapi.Workload {
		return &workloadapi.Workload{
			Uid: "Kubernetes//Pod/apps/web", Name: "web", Addresses: [][]byte{{10, 0, 0, 1}},
			WorkloadName: "web",
			Services:     map[string]*workloadapi.PortList{svcKey: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}},
		}
	}
	wrap := func(w *workloadapi.Workload) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
	}
	for _, tt := range []struct {
		name   string
		change func(*workloadapi.Workload)
		want   []string
	}{
		{"equal", func(*workloadapi.Workload) {}, nil},
		{"scalar", func(w *workloadapi.Workload) { w.WorkloadName = "web-0" }, []string{"workload.workload_name"}},
		{"unset field", func(w *workloadapi.Workload) { w.WorkloadName = "" }, []string{"workload.workload_name"}},
		{"bytes are a leaf", func(w *workloadapi.Workload) { w.Addresses[0] = []byte{10, 0, 0, 2} }, []string{"workload.addresses[0]"}},
		{"map entry", func(w *workloadapi.Workload) { w.Services[svcKey].Ports[0].TargetPort = 0 },
			[]string{`workload.services["` + svcKey + `"].ports[0].target_port`}},
		{"list element added", func(w *workloadapi.Workload) {
			w.Services[svcKey].Ports = append(w.Services[svcKey].Ports, &workloadapi.Port{ServicePort: 90})
		}, []string{`workload.services["` + svcKey + `"].ports[1]`}},
		{"enum", func(w *workloadapi.Workload) { w.Status = workloadapi.WorkloadStatus_UNHEALTHY }, []string{"workload.status"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := base()
			tt.change(got)
			if diff := cmp.Diff(tt.want, fieldDiffs(wrap(base()), wrap(got))); diff != "" {
				t.Errorf("fieldDiffs() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	t.Parallel()
	pack := func(name string) *anypb.Any {
		a, err := anypb.New(&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{Name: name}}})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	istiod := map[string]*anypb.Any{"a/x": pack("x"), "a/y": pack("y"), "a/only": pack("only")}
	canopy := map[string]*anypb.Any{"a/x": pack("x"), "a/y": pack("y2")}
	sc, diffs, err := compareTables(workloadapi.AddressTypeURL, istiod, canopy)
	if err != nil {
		t.Fatal(err)
	}
	if want := (score{typ: "Address", identical: 1, total: 3}); sc != want {
		t.Errorf("score = %+v, want %+v", sc, want)
	}
	list := []allowed{
		{difference: difference{Type: "Address", Resource: "a/y", Field: "service.name"}, Why: "test"},
		{difference: difference{Type: "Address", Resource: "a/z", Field: "service.name"}, Why: "nothing differs there"},
	}
	unexpected, stale := judge(diffs, list)
	var got []difference
	for _, d := range unexpected {
		for _, f := range d.fields {
			got = append(got, difference{Type: d.typ, Resource: d.name, Field: f})
		}
	}
	if diff := cmp.Diff([]difference{{Type: "Address", Resource: "a/only", Field: onlyIstiod}}, got); diff != "" {
		t.Errorf("unexpected differences mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(list[1:], stale, cmp.AllowUnexported(allowed{})); diff != "" {
		t.Errorf("stale entries mismatch (-want +got):\n%s", diff)
	}
}
