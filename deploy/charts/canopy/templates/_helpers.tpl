{{/* The image of a component: hub/name:tag, tag defaulting to appVersion. */}}
{{- define "canopy.image" -}}
{{ .root.Values.image.hub }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* Labels every object carries; "app" is what selectors and canopyctl use. */}}
{{- define "canopy.labels" -}}
app: {{ .name }}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: canopy
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
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
