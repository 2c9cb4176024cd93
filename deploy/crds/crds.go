// Package crds embeds the CustomResourceDefinitions Canopy reads (see
// README.md), so that the test environment and the local cluster install
// exactly what deploy/ ships.
package crds

import "embed"

// FS holds the CRD manifests, one or more YAML documents per file.
//
//go:embed *.yaml
var FS embed.FS
