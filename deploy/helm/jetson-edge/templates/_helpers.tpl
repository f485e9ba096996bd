{{- define "jetson-edge.labels" -}}
app.kubernetes.io/name: jetson-edge
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "jetson-edge.engine" -}}
{{ .Values.engineCache.hostPath }}/{{ base .Values.config.sourceModel | trimSuffix ".onnx" }}.{{ .Values.config.precision }}.engine
{{- end -}}

{{/* Probes run inside the pod (the daemon listens on 127.0.0.1, which kubelet's httpGet cannot reach), with
bash's /dev/tcp instead of a Python interpreter per probe. The port is an argument, never part of the script.
alive: /healthz answers at all (200, or 503 while a camera reconnects); ready: it answers 200 (a recent frame). */}}
{{- define "jetson-edge.probe" -}}
{{- $codes := ternary "200" "200|503" (eq .kind "ready") -}}
{{- $script := printf "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && read -r -t 2 status <&3 && [[ $status =~ ^HTTP/1\\.[01]\\ (%s)\\  ]]" $codes -}}
{{- list "bash" "-c" $script "probe" (toString (int .port)) | toJson -}}
{{- end -}}
