{{/* Names and labels shared by every template. */}}

{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* At most 40 characters: "<fullname>-master-headless" must stay within
     the 63 of a Service name, and StatefulSet names within 52. */}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "strata.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "strata.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "strata.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: strata
{{- end -}}

{{/* Selector labels of one component: master, store-node, ssd-agent, etcd. */}}
{{- define "strata.selector" -}}
app.kubernetes.io/name: {{ include "strata.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "strata.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* HA: masters elect a leader through etcd (external or the chart's own). */}}
{{- define "strata.ha" -}}
{{- if or .Values.etcd.endpoints .Values.etcd.deploy -}}true{{- end -}}
{{- end -}}

{{/* The Secret with the CA (ca.crt) and the masters' certificate (tls.crt,
     tls.key) for TLS to etcd: etcd.tls.secret when given, else for the
     chart's own etcd the one it makes (empty: plain http). */}}
{{- define "strata.etcdTlsSecret" -}}
{{- $own := dig "tls" "secret" "" .Values.etcd -}}
{{- if $own -}}
{{- $own -}}
{{- else if and .Values.etcd.deploy (not .Values.etcd.endpoints) -}}
{{- printf "%s-etcd-tls" (include "strata.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "strata.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- .Values.etcd.endpoints -}}
{{- else -}}
{{- $name := printf "%s-etcd" (include "strata.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "https://%s-%d.%s.%s.svc:2379" $name $i $name $ns) -}}
{{- end -}}
{{- join "," $eps -}}
{{- end -}}
{{- end -}}

{{/* What members pass as --master: every master pod by name through the
     headless Service, ready or not (a follower redirects to the leader; a
     restarted master is not ready until its members report to it, so they
     must reach it before it is). */}}
{{- define "strata.masterAddr" -}}
{{- $name := printf "%s-master" (include "strata.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- $port := int .Values.master.grpcPort -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.master.replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s-headless.%s.svc:%d" $name $i $name $ns $port) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* What clients dial: the master Service (the ready leader). */}}
{{- define "strata.clientAddr" -}}
{{- printf "%s-master.%s.svc:%d" (include "strata.fullname" .) .Release.Namespace (int .Values.master.grpcPort) -}}
{{- end -}}

{{- define "strata.secretName" -}}
{{- default (printf "%s-tokens" (include "strata.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* The restricted pod security profile every Strata container runs under. */}}
{{- define "strata.containerSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "strata.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* Log and trace flags every service takes. */}}
{{- define "strata.telemetryArgs" -}}
- --log-format={{ .Values.logFormat }}
{{- with .Values.tracing.otlpEndpoint }}
- --otlp-endpoint={{ . }}
{{- end }}
{{- end }}
