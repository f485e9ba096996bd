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

{{/* The daemon's config (the DaemonSet's ConfigMap and the gate Jobs'): every value goes through toYaml/toJson,
so a value cannot add keys. */}}
{{- define "jetson-edge.config" -}}
{{- $cfg := dict
  "model" (dict "path" (include "jetson-edge.engine" .))
  "source" (dict "uri" (.Values.config.source | toString) "width" (int .Values.config.width)
                 "height" (int .Values.config.height) "fps" .Values.config.fps)
  "backend" (dict "kind" "tensorrt")
  "runtime" (dict "budget_ms" .Values.config.budgetMs)
  "build" (dict "precision" (.Values.config.precision | toString) "engines_dir" (.Values.engineCache.hostPath | toString))
  "service" (dict
    "metrics" (dict "enabled" (.Values.metrics.enabled | default false) "host" "127.0.0.1" "port" (int .Values.config.metricsPort))
    "telemetry" (dict "enabled" true)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The pod's user: no login user of the host (JetPack's first one is 1000); the image's USER. */}}
{{- define "jetson-edge.uid" -}}10001{{- end -}}

{{/* kubelet creates a missing hostPath folder root-owned and empty: hand such a folder to the pod's user. A
folder that exists with content, or owned by someone else, is not the chart's: refused, never chowned. */}}
{{- define "jetson-edge.own" -}}
set -eu
for spec in "$@"; do
  dir="${spec%%:*}"; owner="${spec#*:}"
  [ -d "$dir" ] || continue
  now="$(stat -c %u:%g "$dir")"
  if [ "$now" = "$owner" ]; then continue; fi
  if [ "$now" = 0:0 ] && [ -z "$(ls -A "$dir")" ]; then chown "$owner" "$dir"; continue; fi
  echo "host folder ${dir#/host} is owned by $now and not empty: not created by this chart; pick a new folder" >&2
  exit 1
done
{{- end -}}

{{/* A container's resources ({resources, extra}): the memory request is the memory limit, so the pod never uses
more memory than it asked for (the last kubelet evicts under memory pressure); `extra` are more limits (device
plugin resources). */}}
{{- define "jetson-edge.resources" -}}
{{- $limits := merge (deepCopy (.extra | default dict)) .resources.limits -}}
{{- toYaml (dict "requests" (dict "cpu" .resources.requests.cpu "memory" .resources.limits.memory) "limits" $limits) -}}
{{- end -}}

{{/* The pods' PriorityClass: an existing one by name, the chart's own, or none (""). */}}
{{- define "jetson-edge.priorityClassName" -}}
{{- if .Values.priorityClass.name -}}{{ .Values.priorityClass.name }}
{{- else if .Values.priorityClass.create -}}{{ printf "%s-jetson-edge" .Release.Name }}
{{- end -}}
{{- end -}}
