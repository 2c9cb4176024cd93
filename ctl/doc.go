// Package ctl holds canopyctl's commands, each a plain function over a
// context, its options and an io.Writer: cmd/canopyctl only wires flags to
// them. Reads go through ctl/cluster (port-forwards through the API
// server); tables are built by ctl/view.
package ctl
