{{/* Names, labels and images shared by every template. */}}

{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpushare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpushare
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "node"). */}}
{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The stock kube-scheduler, by default of the cluster's own minor version. */}}
{{- define "gpushare.schedulerImage" -}}
{{- $minor := .Capabilities.KubeVersion.Minor | trimSuffix "+" }}
{{- $tag := default (printf "v%s.%s.0" .Capabilities.KubeVersion.Major $minor) .Values.scheduler.image.tag }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{- define "gpushare.serviceAccountName" -}}
{{- printf "%s-%s" (include "gpushare.fullname" .root) .component }}
{{- end }}

{{- define "gpushare.extenderServiceName" -}}
{{- printf "%s-extender" (include "gpushare.fullname" .) }}
{{- end }}

{{- define "gpushare.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "gpushare.fullname" .) }}
{{- end }}

{{/* The further schedulerNames the scheduler serves, comma separated (none when
absent, as in releases upgraded with --reuse-values from older charts). The schema
checks each name; only here can one be compared with scheduler.name. */}}
{{- define "gpushare.extraSchedulerNames" -}}
{{- $names := .Values.scheduler.extraSchedulerNames | default list -}}
{{- if has .Values.scheduler.name $names }}
{{- fail (printf "scheduler.extraSchedulerNames: %s is scheduler.name already (each name is one profile of kube-scheduler)" .Values.scheduler.name) }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{- define "gpushare.leaseNamespace" -}}
{{- default .Release.Namespace .Values.scheduler.leaderElection.resourceNamespace }}
{{- end }}

{{/* NODE_NAME and the GPU backend, as the device plugin and the isolation agent read them. */}}
{{- define "gpushare.nodeEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: GPUSHARE_BACKEND
  value: {{ .Values.gpu.backend | quote }}
{{- if eq .Values.gpu.backend "mock" }}
- name: GPUSHARE_MOCK_GPUS
  value: {{ .Values.gpu.mockGpus | quote }}
{{- else if .Values.gpu.driverRoot }}
{{- /* No toolkit: the driver's root is mounted at /driver-root and libnvidia-ml.so.1
loaded from it by path (not LD_LIBRARY_PATH: that would also put the driver root's C
library before the image's). void: a toolkit on the node leaves the pod alone. */}}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
- name: GPUSHARE_DRIVER_ROOT
  value: /driver-root
{{- else }}
{{- /* The NVIDIA container toolkit then mounts the driver's libnvidia-ml.so.1 and the
GPUs' device files into the container, so NVML works. */}}
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- end }}
{{- end }}

{{/* The driver's root filesystem (gpu.driverRoot), read-only at /driver-root.
HostToContainer: the GPU operator mounts its driver there after the pod may have
started. */}}
{{- define "gpushare.driverRootMount" -}}
{{- if and (ne .Values.gpu.backend "mock") .Values.gpu.driverRoot }}
- name: driver-root
  mountPath: /driver-root
  readOnly: true
  mountPropagation: HostToContainer
{{- end }}
{{- end }}

{{/* Fails where gpu.driverRoot cannot work: without the toolkit nothing but privileged
lets a container open /dev/nvidia*, which NVML needs. */}}
{{- define "gpushare.checkDriverRoot" -}}
{{- if and (ne .Values.gpu.backend "mock") .Values.gpu.driverRoot .Values.isolation.enabled (not .Values.isolation.privileged) }}
{{- fail "gpu.driverRoot needs isolation.privileged=true: without the NVIDIA container toolkit only a privileged container may open /dev/nvidia*, which NVML needs" }}
{{- end }}
{{- end }}

{{- define "gpushare.backendArgs" -}}
- --node-name=$(NODE_NAME)
- --backend={{ .Values.gpu.backend }}
{{- if eq .Values.gpu.backend "mock" }}
- --mock-gpus={{ .Values.gpu.mockGpus }}
{{- else }}
- --gpu-memory-rounding={{ .Values.gpu.memoryRounding | default "up" }}
{{- end }}
- --log-level={{ .Values.logLevel }}
{{- end }}

{{/* "true" when the webhooks carry CEL matchConditions (only pods naming an
aliyun.com/gpu-* resource reach them), "" when not. webhook.matchConditions: auto
follows the cluster: AdmissionWebhookMatchConditions is beta and on from 1.28 (GA in
1.30); on older API servers the field is unknown or dropped, and the webhooks would
then match every pod. true / false force it. */}}
{{- define "gpushare.webhookMatchConditions" -}}
{{- $wanted := .Values.webhook.matchConditions -}}
{{- if eq (toString $wanted) "auto" -}}
{{- if semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- else if eq (toString $wanted) "true" }}true{{ end -}}
{{- end }}

{{/* The webhooks' failurePolicy. auto: Fail when matchConditions keep pods that ask
for no GPU away from the webhooks, Ignore when they do not (every pod creation
would otherwise fail while the extender is down). */}}
{{- define "gpushare.webhookFailurePolicy" -}}
{{- $policy := .Values.webhook.failurePolicy -}}
{{- if eq $policy "auto" -}}
{{- if include "gpushare.webhookMatchConditions" . }}Fail{{ else }}Ignore{{ end -}}
{{- else }}{{ $policy }}{{ end -}}
{{- end }}

{{/* "true" when the ValidatingAdmissionPolicy that keeps the device plugin to its own
node is rendered: devicePlugin.ownNodePolicy and a cluster of Kubernetes >= 1.30, where
admissionregistration.k8s.io/v1 serves the policies (GA) and a pod's token names its
node (ServiceAccountTokenPodNodeInfo, on by default). Unset (values of an older release
kept with --reuse-values) counts as on. */}}
{{- define "gpushare.ownNodePolicy" -}}
{{- $wanted := ne (toString .Values.devicePlugin.ownNodePolicy) "false" -}}
{{- if and $wanted (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{ end -}}
{{- end }}
