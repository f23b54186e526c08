{{/* Chart name, truncated to the 63 characters Kubernetes allows. */}}
{{- define "kdedup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; pods are <fullname>-0, -1, ... */}}
{{- define "kdedup.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kdedup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kdedup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kdedup.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kdedup.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: dedup
{{- end -}}

{{- define "kdedup.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Bytes of a Kubernetes memory quantity ("2Gi", "1536Mi", "2G", "1.5Gi",
"2147483648"); 0 when empty.
*/}}
{{- define "kdedup.quantityBytes" -}}
{{- $q := toString . | trim -}}
{{- if or (not $q) (eq $q "<nil>") -}}0{{- else -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $unit := trimPrefix $num $q -}}
{{- $scale := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- if or (not $num) (not (hasKey $scale $unit)) -}}
{{- fail (printf "resources.limits.memory: cannot read the quantity %q (use e.g. 2Gi)" $q) -}}
{{- end -}}
{{- printf "%.0f" (mulf (float64 $num) (get $scale $unit)) -}}
{{- end -}}
{{- end -}}

{{/*
The kdedup config file: .Values.config plus what the chart owns (the state
volume, the metrics port the probes use, the static member id, and the
filters' memory budget from the memory limit unless config.memory.max_bytes
is set).
*/}}
{{- define "kdedup.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $memory := default (dict) (get $cfg "memory") -}}
{{- $limits := default (dict) (get (default (dict) .Values.resources) "limits") -}}
{{- $limit := include "kdedup.quantityBytes" (get $limits "memory") | float64 -}}
{{- $percent := float64 (default 0 .Values.memoryBudget.percentOfLimit) -}}
{{- if and (not (hasKey $memory "max_bytes")) (gt $limit 0.0) (gt $percent 0.0) -}}
{{- $_ := set $memory "max_bytes" (printf "%.0f" (divf (mulf $limit $percent) 100) | int64) -}}
{{- $_ := set $cfg "memory" $memory -}}
{{- end -}}
{{- $state := merge (dict "dir" .Values.stateDir) (default (dict) (get $cfg "state")) -}}
{{- $_ := set $state "dir" .Values.stateDir -}}
{{- $_ := set $cfg "state" $state -}}
{{- $metrics := default (dict) (get $cfg "metrics") -}}
{{- $_ := set $metrics "address" (printf "0.0.0.0:%d" (int .Values.metrics.port)) -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- if .Values.staticMembership.enabled -}}
{{- $consumer := default (dict) (get $cfg "consumer") -}}
{{- $_ := set $consumer "group.instance.id" "${POD_NAME}" -}}
{{- $_ := set $cfg "consumer" $consumer -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Environment of the kdedup containers: what ${VAR} in the config sees. */}}
{{- define "kdedup.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: KAFKA_BOOTSTRAP
  value: {{ required "kafka.bootstrapServers is required" .Values.kafka.bootstrapServers | quote }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- if .Values.secretEnv.existingSecret }}
{{- range $name, $key := .Values.secretEnv.keys }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.secretEnv.existingSecret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end -}}
