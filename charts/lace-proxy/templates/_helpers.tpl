{{/* The chart's name (nameOverride wins). */}}
{{- define "lace-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of the release's objects: fullnameOverride, else the release name if it already
contains the chart's name, else "<release>-<chart>"; at most 63 characters (a DNS label).
*/}}
{{- define "lace-proxy.fullname" -}}
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

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "lace-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* What selects the DaemonSet's pods: stable across upgrades (a selector is immutable). */}}
{{- define "lace-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lace-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "lace-proxy.labels" -}}
helm.sh/chart: {{ include "lace-proxy.chart" . }}
{{ include "lace-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: proxy
app.kubernetes.io/part-of: lace
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "lace-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lace-proxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "IP:port" for a bind address, with an IPv6 address in brackets as Go writes it. */}}
{{- define "lace-proxy.hostPort" -}}
{{- $ip := index . 0 -}}
{{- $port := index . 1 -}}
{{- if contains ":" $ip -}}
{{- printf "[%s]:%v" $ip $port -}}
{{- else -}}
{{- printf "%s:%v" $ip $port -}}
{{- end -}}
{{- end -}}

{{/*
Deep-merge the map "src" into the map "dst", in place: maps merge key by key, anything else
(lists, false, "", null included) replaces. Sprig's merge functions skip "empty" values, so
they could not turn a default true into false.
*/}}
{{- define "lace-proxy.deepMerge" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) -}}
{{- include "lace-proxy.deepMerge" (dict "dst" (get $dst $key) "src" $value) -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The KubeProxyConfiguration (as YAML) that lace_proxy/config/ reads. Only fields its schema
knows are written; values.extraConfig is deep-merged last, so it may set any other field the
schema accepts (or override one of these). Empty lists and strings are left out, which means
"lace-proxy's default" for every field here.
*/}}
{{- define "lace-proxy.config" -}}
{{- $v := .Values -}}
{{- $config := dict
  "mode" $v.mode
  "bindAddress" $v.bindAddress
  "healthzBindAddress" (include "lace-proxy.hostPort" (list $v.healthz.bindAddress $v.healthz.port))
  "metricsBindAddress" (include "lace-proxy.hostPort" (list $v.metrics.bindAddress $v.metrics.port))
  "syncPeriod" $v.syncPeriod
  "minSyncPeriod" $v.minSyncPeriod
  "masqueradeAll" $v.masqueradeAll
  "detectLocalMode" $v.detectLocalMode
-}}
{{- with $v.clusterCIDR }}{{ $_ := set $config "clusterCIDR" . }}{{ end -}}
{{- with $v.nodePortAddresses }}{{ $_ := set $config "nodePortAddresses" . }}{{ end -}}
{{- $detectLocal := dict -}}
{{- with $v.detectLocal.bridgeInterface }}{{ $_ := set $detectLocal "bridgeInterface" . }}{{ end -}}
{{- with $v.detectLocal.interfaceNamePrefix }}{{ $_ := set $detectLocal "interfaceNamePrefix" . }}{{ end -}}
{{- with $detectLocal }}{{ $_ := set $config "detectLocal" . }}{{ end -}}
{{- $ipvs := dict
  "scheduler" $v.ipvs.scheduler
  "strictARP" $v.ipvs.strictARP
  "tcpTimeout" $v.ipvs.tcpTimeout
  "tcpFinTimeout" $v.ipvs.tcpFinTimeout
  "udpTimeout" $v.ipvs.udpTimeout
-}}
{{- with $v.ipvs.excludeCIDRs }}{{ $_ := set $ipvs "excludeCIDRs" . }}{{ end -}}
{{- $_ := set $config "ipvs" $ipvs -}}
{{- with $v.conntrack }}{{ $_ := set $config "conntrack" (deepCopy .) }}{{ end -}}
{{- $egress := dict "enabled" $v.lace.egress.enabled "table" $v.lace.egress.table -}}
{{- with $v.lace.egress.nonMasqueradeCIDRs }}{{ $_ := set $egress "nonMasqueradeCIDRs" . }}{{ end -}}
{{- with $v.lace.egress.routablePrefixes }}{{ $_ := set $egress "routablePrefixes" . }}{{ end -}}
{{- $lace := dict
  "nftables" (dict "table" $v.lace.nftables.table)
  "routing" (dict "table" $v.lace.routing.table "priority" $v.lace.routing.priority)
  "ipvs" (dict "serviceAddresses" $v.lace.ipvs.serviceAddresses)
  "egress" $egress
-}}
{{- with $v.node.serviceCIDRs }}{{ $_ := set $lace "serviceCIDRs" . }}{{ end -}}
{{- if $v.lace.bgp.enabled -}}
{{- $bgp := pick $v.lace.bgp "enabled" "asn" "peers" "announce" "gracefulRestartTime" -}}
{{- with $v.lace.bgp.routerID }}{{ $_ := set $bgp "routerID" . }}{{ end -}}
{{- $_ := set $lace "bgp" $bgp -}}
{{- end -}}
{{- $_ := set $config "lace" $lace -}}
{{- include "lace-proxy.deepMerge" (dict "dst" $config "src" (deepCopy $v.extraConfig)) -}}
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
{{ toYaml $config -}}
{{- end -}}
