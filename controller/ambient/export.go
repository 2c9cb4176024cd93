package ambient

import (
	"fmt"
	"slices"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// AnnotationExportTo lists, comma-separated, the namespaces a Kubernetes
// Service is exported to, as spec.exportTo does for a ServiceEntry.
const AnnotationExportTo = "networking.istio.io/exportTo"

// The exportTo values with a meaning of their own.
const (
	exportAll  = "*"
	exportSelf = "."
	exportNone = "~"
)

// Export is who may see a Service or a ServiceEntry's hosts.
type Export struct {
	// Published is false when the object is exported to no namespace
	// ("~"): it is not sent at all.
	Published bool
	// Visibility is Service.visibility: PUBLIC, or NAMESPACE for the
	// clients of the object's own namespace only.
	Visibility workloadapi.Service_Visibility
	// Warning says what exportTo asked that node proxies cannot do.
	Warning string
}

// ServiceExport is a Kubernetes Service's Export, from its
// networking.istio.io/exportTo annotation.
func ServiceExport(svc *corev1.Service, cfg Config) Export {
	var list []string
	if v, ok := svc.Annotations[AnnotationExportTo]; ok {
		list = strings.Split(v, ",")
	}
	return ExportOf(list, svc.Namespace, cfg)
}

// ServiceEntryExport is a ServiceEntry's Export, from spec.exportTo.
func ServiceEntryExport(se *networkingv1.ServiceEntry, cfg Config) Export {
	return ExportOf(se.Spec.GetExportTo(), se.Namespace, cfg)
}

// ExportOf resolves the exportTo list of an object of namespace ns; an
// empty list means cfg.DefaultExportTo. "*" exports everywhere; "~"
// (alone) nowhere; "." and ns to the object's own namespace.
//
// The wire has no way to name other namespaces (Service.visibility is
// PUBLIC or NAMESPACE, and a node proxy serves pods of every namespace), so
// a list naming other namespaces, and not "*", is narrowed to the object's
// own namespace with a Warning: narrowing keeps a service from capturing
// the traffic of namespaces it was not exported to, which widening would
// not.
func ExportOf(exportTo []string, ns string, cfg Config) Export {
	cfg = cfg.WithDefaults()
	var list []string
	for _, e := range exportTo {
		if e = strings.TrimSpace(e); e != "" {
			list = append(list, e)
		}
	}
	if len(list) == 0 {
		list = cfg.DefaultExportTo
	}
	if slices.Contains(list, exportAll) {
		return Export{Published: true, Visibility: workloadapi.Service_PUBLIC}
	}
	var others []string
	self := false
	for _, e := range list {
		switch e {
		case exportNone:
		case exportSelf, ns:
			self = true
		default:
			others = append(others, e)
		}
	}
	if !self && len(others) == 0 {
		return Export{}
	}
	out := Export{Published: true, Visibility: workloadapi.Service_NAMESPACE}
	if len(others) > 0 {
		out.Warning = fmt.Sprintf("exportTo names namespaces %s: node proxies can limit a service only to its own namespace, so it is visible in namespace %s only",
			strings.Join(others, ", "), ns)
	}
	return out
}
