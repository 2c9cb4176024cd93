// Package charts embeds Canopy's Helm chart (deploy/charts/canopy), so that
// canopyctl installs, the tests render and the test environment's CRDs are
// exactly what the chart ships.
package charts

import (
	"embed"
	"io/fs"
)

//go:embed all:canopy
var files embed.FS

// Canopy is the chart's directory: Chart.yaml at its root.
func Canopy() fs.FS {
	sub, err := fs.Sub(files, "canopy")
	if err != nil {
		// fs.Sub fails only for an invalid path; "canopy" is valid.
		panic(err)
	}
	return sub
}
