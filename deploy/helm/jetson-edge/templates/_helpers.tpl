{{- define "jetson-edge.labels" -}}
app.kubernetes.io/name: jetson-edge
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "jetson-edge.engine" -}}
{{ .Values.engineCache.hostPath }}/{{ base .Values.config.sourceModel | trimSuffix ".onnx" }}.{{ .Values.config.precision }}.engine
{{- end -}}

{{/* The daemon listens on the pod's 127.0.0.1, which kubelet's httpGet cannot reach: probe from inside. */}}
{{- define "jetson-edge.healthz" -}}
["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{{ .Values.config.metricsPort }}/healthz', timeout=2)"]
{{- end -}}
