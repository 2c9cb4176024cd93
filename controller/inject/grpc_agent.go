package inject

import (
	corev1 "k8s.io/api/core/v1"
)

// grpcBootstrap is where pilot-agent writes the xDS bootstrap proxyless
// gRPC applications read, on the istio-xds volume.
const grpcBootstrap = "/etc/istio/proxy/grpc-bootstrap.json"

// renderGRPCAgent is the grpc-agent template for proxyless gRPC:
// istio-proxy runs pilot-agent only (no Envoy, no redirection), which
// proxies xDS for the applications over a unix socket and writes their
// certificates; every application container gets the bootstrap variable
// and the shared volumes. security.istio.io/tlsMode is not set: an
// application that uses mTLS sets it itself.
func renderGRPCAgent(p *params) (*injection, error) {
	env, err := p.identityEnv(false)
	if err != nil {
		return nil, err
	}
	env = append([]corev1.EnvVar{
		valueEnv("ISTIO_META_GENERATOR", "grpc"),
		valueEnv("OUTPUT_CERTS", "/var/lib/istio/data"),
	}, env...)
	env = append(env,
		// gRPC resolves xds:/// names itself; no DNS proxying.
		valueEnv("ISTIO_META_DNS_CAPTURE", "false"),
		valueEnv("DISABLE_ENVOY", "true"),
	)
	proxy := corev1.Container{
		Name:            ProxyContainer,
		Image:           p.image,
		ImagePullPolicy: p.cfg.ImagePullPolicy,
		Ports:           []corev1.ContainerPort{{Name: "mesh-metrics", ContainerPort: 15020, Protocol: corev1.ProtocolTCP}},
		Args:            p.proxyArgs(),
		Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
			Command: []string{"pilot-agent", "wait", "--url=http://localhost:15020/healthz/ready"},
		}}},
		Env:       env,
		Resources: p.resources(),
		VolumeMounts: []corev1.VolumeMount{
			mount("workload-socket", "/var/run/secrets/workload-spiffe-uds"),
			mount("workload-certs", "/var/run/secrets/workload-spiffe-credentials"),
			mount("istiod-ca-cert", "/var/run/secrets/istio"),
			mount("istio-data", "/var/lib/istio/data"),
			mount("istio-xds", "/etc/istio/proxy"),
			mount("istio-token", "/var/run/secrets/tokens"),
			mount("istio-podinfo", "/etc/istio/pod"),
		},
	}
	if p.statusPort != "0" {
		// Without Envoy, readiness is pilot-agent's, on 15020.
		proxy.ReadinessProbe = p.readinessProbe(15020)
	}
	annotations := p.commonAnnotations()
	annotations[AnnotationRewriteProbes] = "false"
	return &injection{
		labels:      p.canonicalLabels(false),
		annotations: annotations,
		containers:  []corev1.Container{proxy},
		volumes: []corev1.Volume{
			emptyDir("workload-socket", ""),
			emptyDir("workload-certs", ""),
			emptyDir("istio-xds", corev1.StorageMediumMemory),
			emptyDir("istio-data", ""),
			podInfoVolume(),
			tokenVolume(),
			configMapVolume("istiod-ca-cert", "istio-ca-root-cert", false),
		},
		appEnv: []corev1.EnvVar{
			valueEnv("GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT", "true"),
			valueEnv("GRPC_XDS_BOOTSTRAP", grpcBootstrap),
		},
		appMounts: []corev1.VolumeMount{
			mount("istio-data", "/var/lib/istio/data"),
			mount("istio-xds", "/etc/istio/proxy"),
			mount("workload-certs", "/var/run/secrets/workload-spiffe-credentials"),
		},
	}, nil
}
