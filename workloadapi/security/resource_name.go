package security

// ResourceName returns an Authorization's xDS name, "<namespace>/<name>"
// (docs/wire-contract.md §1.9).
func ResourceName(a *Authorization) string {
	return a.GetNamespace() + "/" + a.GetName()
}
