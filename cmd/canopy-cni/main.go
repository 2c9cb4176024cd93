// Command canopy-cni is Canopy's chained CNI plugin. The container runtime
// execs it on every pod start; it asks the node agent to enroll the pod.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/canopy-mesh/canopy/cni/plugin"
	canopyversion "github.com/canopy-mesh/canopy/internal/version"
)

func main() {
	skel.PluginMainFuncs(plugin.Plugin{}.Funcs(), version.PluginSupports("1.0.0", "1.1.0"), "canopy-cni "+canopyversion.Get())
}
