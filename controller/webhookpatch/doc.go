// Package webhookpatch keeps the caBundle of the sidecar injector's
// MutatingWebhookConfigurations, and of the configuration validator's
// ValidatingWebhookConfigurations, equal to the mesh's root certificates,
// as istiod's webhook certificate patcher and validation controller do:
// the chart installs the configurations with an empty caBundle, and the
// controller, whose CA issued the webhooks' serving certificate, fills it
// in, puts it back when someone resets it, and rewrites it when the roots
// change.
//
// The validating configurations are installed failing open (failurePolicy
// Ignore), so that the API server takes configuration while no controller
// answers; the Patcher closes them (Fail) once the webhook is seen
// refusing a probe it must refuse (a dry-run object carrying Istio's
// always-reject annotation), as istiod does.
//
// It touches only configurations labelled istio.io/rev=<revision>, and in
// them only the webhooks whose name ends in "sidecar-injector.istio.io" or
// "validation.istio.io".
//
// Plan and PlanValidating are the decisions, pure: a configuration and a
// bundle in, a JSON Patch (or none) out. Patcher is the loop around them:
// informers on the configurations of its revision, a work queue, and one
// conditional patch per configuration that differs. canopy-controller runs
// it on the replica holding its writers' Lease; a patch is sent only when
// something differs, and is refused when the configuration changed since
// it was read, so an overlap with a former leader does no harm. A Patcher
// is safe for concurrent use; SetBundle may be called at any time.
//
// Anything in cmd/ may import this package; it imports only client-go and
// the Kubernetes API.
package webhookpatch
