{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "lace-networks.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object of the release (Networks also carry lace-cni.io/network
implicitly; it is not written here). */}}
{{- define "lace-networks.labels" -}}
helm.sh/chart: {{ include "lace-networks.chart" . }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: lace
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A selector over Network labels that picks one network by name (the implicit label). */}}
{{- define "lace-networks.selectNetwork" -}}
matchLabels:
  lace-cni.io/network: {{ . | quote }}
{{- end -}}

{{/*
A Network object. Argument: (dict "root" $ "name" NAME "labels" MAP "spec" MAP).
*/}}
{{- define "lace-networks.network" -}}
apiVersion: lace-cni.io/v1alpha1
kind: Network
metadata:
  name: {{ .name }}
  labels:
    {{- include "lace-networks.labels" .root | nindent 4 }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- toYaml .spec | nindent 2 }}
{{- end -}}

{{/* The destination of the host-local peering: hostLocalRouting.dest, else the default network. */}}
{{- define "lace-networks.hostLocalDest" -}}
{{- if .Values.hostLocalRouting.dest -}}
{{- .Values.hostLocalRouting.dest -}}
{{- else if .Values.defaultNetwork.enabled -}}
{{- .Values.defaultNetwork.name -}}
{{- else -}}
{{- fail "hostLocalRouting.dest is required when defaultNetwork.enabled is false (it defaults to the default network)" -}}
{{- end -}}
{{- end -}}

{{/* Every Network name the chart declares, checked for duplicates (the render fails). */}}
{{- define "lace-networks.checkNames" -}}
{{- $names := list -}}
{{- if .Values.defaultNetwork.enabled }}{{ $names = append $names .Values.defaultNetwork.name }}{{ end -}}
{{- if .Values.internet.enabled }}{{ $names = append $names .Values.internet.name }}{{ end -}}
{{- if .Values.hostLocalNetwork.enabled }}{{ $names = append $names .Values.hostLocalNetwork.name }}{{ end -}}
{{- range .Values.extraNetworks }}{{ $names = append $names .name }}{{ end -}}
{{- range $i, $name := $names -}}
{{- if has $name (slice $names (add1 $i)) -}}
{{- fail (printf "Network %q is declared twice (defaultNetwork, internet, hostLocalNetwork and extraNetworks need distinct names)" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
