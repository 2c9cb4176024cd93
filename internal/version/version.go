// Package version holds the build's version, set at link time by the
// Makefile: -X github.com/canopy-mesh/canopy/internal/version.version=<v>.
package version

// version is a link-time constant, the one kind of package-level variable
// Canopy allows.
var version = "dev"

// Get returns the version this binary was built as, "dev" for a plain go build.
func Get() string { return version }
