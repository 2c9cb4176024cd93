package inject

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshapi "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// proxyConfig is the pod's ProxyConfig: the discovery address of cfg with
// the pod's proxy.istio.io/config annotation (YAML or JSON) merged over it,
// as Istio's injector merges it over the mesh default. Fields Istio's
// ProxyConfig does not know are ignored, as Istio ignores them.
func proxyConfig(annotation string, hasAnnotation bool, cfg Config) (*meshapi.ProxyConfig, error) {
	pc := &meshapi.ProxyConfig{DiscoveryAddress: cfg.DiscoveryAddress}
	if !hasAnnotation {
		return pc, nil
	}
	js, err := yaml.YAMLToJSON([]byte(annotation))
	if err != nil {
		return nil, fmt.Errorf("annotation %s: parse: %w", AnnotationProxyConfig, err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return pc, nil
	}
	over := &meshapi.ProxyConfig{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, over); err != nil {
		return nil, fmt.Errorf("annotation %s: not a ProxyConfig: %w", AnnotationProxyConfig, err)
	}
	if m := over.GetInterceptionMode(); m != meshapi.ProxyConfig_REDIRECT {
		return nil, &RefusedError{
			Annotation: AnnotationProxyConfig,
			Value:      "interceptionMode: " + m.String(),
			Reason:     "only REDIRECT interception is supported",
		}
	}
	proto.Merge(pc, over)
	return pc, nil
}

// proxyConfigJSON is PROXY_CONFIG: compact, stable JSON (protojson varies
// its whitespace on purpose, so it is compacted) and a final line break,
// like the value Istio's template writes.
func proxyConfigJSON(pc *meshapi.ProxyConfig) (string, error) {
	js, err := protojson.Marshal(pc)
	if err != nil {
		return "", fmt.Errorf("marshal proxy config: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, js); err != nil {
		return "", fmt.Errorf("compact proxy config: %w", err)
	}
	buf.WriteByte('\n')
	return buf.String(), nil
}
