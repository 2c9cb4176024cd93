{{/* The image of a component: hub/name:tag, tag defaulting to appVersion. */}}
{{- define "canopy.image" -}}
{{ .root.Values.image.hub }}/{{ .name }}:{{ include "canopy.tag" . }}
{{- end }}

{{/*
A component's image tag: its own (.tag, from <component>.imageTag) when
set, else image.tag, else the chart's appVersion.
*/}}
{{- define "canopy.tag" -}}
{{ .tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/*
Labels every object carries. "app.kubernetes.io/name" is the component,
which canopyctl finds pods by; "app" is the label of the Istio component
it replaces where istioctl finds pods by it (.app: istiod for the
controller, ztunnel for the node proxy), else the component's name. The
workloads' selectors use "app".
*/}}
{{- define "canopy.labels" -}}
app: {{ .app | default .name }}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: canopy
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ include "canopy.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* The downward-API environment every component reads. */}}
{{- define "canopy.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: INSTANCE_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
{{- end }}

{{/*
The Lease of canopy-controller's writers, one per revision: two revisions'
controllers write different webhook configurations and must not take
turns on one Lease.
*/}}
{{- define "canopy.controllerLease" -}}
canopy-controller{{ with .Values.revision }}-{{ . }}{{ end }}
{{- end }}

{{/*
The validator's ValidatingWebhookConfiguration of the revision, named as
Istio's: istio-validator(-<revision>)-<namespace>.
*/}}
{{- define "canopy.validatorName" -}}
istio-validator{{ with .Values.revision }}-{{ . }}{{ end }}-{{ .Release.Namespace }}
{{- end }}

{{/*
One webhook of the validator: canopy-controller's Service (.service), port
443 (15017 in the pod), path /validate, creation and update of anything in
Istio's API groups, as Istio's chart registers it. failurePolicy Ignore:
the API server takes configuration while no controller answers (at
install); canopy-controller sets Fail once its webhook refuses a probe, as
istiod does. Deletes are never sent.
*/}}
{{- define "canopy.validatorWebhook" }}
- name: {{ .name }}
  clientConfig:
    service:
      name: {{ .service }}
      namespace: {{ .ns | quote }}
      path: /validate
      port: 443
  rules:
  - operations: [CREATE, UPDATE]
    apiGroups: [security.istio.io, networking.istio.io, telemetry.istio.io, extensions.istio.io]
    apiVersions: ["*"]
    resources: ["*"]
  failurePolicy: Ignore
  sideEffects: None
  admissionReviewVersions: [v1]
{{- end }}

{{/* The injector's MutatingWebhookConfiguration, named as Istio's. */}}
{{- define "canopy.injectorName" -}}
istio-sidecar-injector{{ with .Values.revision }}-{{ . }}{{ end }}
{{- end }}

{{/*
The name of canopy-controller's objects (Deployment, Service,
ServiceAccount, Roles): canopy-controller, suffixed with the revision for
a revision's control plane, so that two run side by side in one
namespace during a canary upgrade (Istio's istiod-<revision>).
*/}}
{{- define "canopy.controllerName" -}}
canopy-controller{{ with .Values.revision }}-{{ . }}{{ end }}
{{- end }}

{{/* The revision as istio.io/rev carries it: "default" for none. */}}
{{- define "canopy.revision" -}}
{{ .Values.revision | default "default" }}
{{- end }}

{{/*
One webhook of the injector: canopy-controller's Service (.service), port 443 (15017
in the pod), path /inject, pod creation only. Istio's chart sets no
timeoutSeconds either, so the API server's default of 10 s applies. The
release namespace is never sent (canopy-controller refuses it as well).
*/}}
{{- define "canopy.injectorWebhook" }}
- name: {{ .prefix }}sidecar-injector.istio.io
  clientConfig:
    service:
      name: {{ .service }}
      namespace: {{ .ns | quote }}
      path: /inject
      port: 443
  rules:
  - operations: [CREATE]
    apiGroups: [""]
    apiVersions: [v1]
    resources: [pods]
  sideEffects: None
  failurePolicy: Fail
  reinvocationPolicy: Never
  admissionReviewVersions: [v1]
{{- end }}
