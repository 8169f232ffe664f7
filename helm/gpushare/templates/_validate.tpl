{{/* Checks of the values whose form a JSON Schema `pattern` would describe. The schema
keeps the types, enums and ranges (its messages name the value and say what it wants);
a failed `pattern` shows only the regular expression, and Helm honours no custom
message, so these are checked here, where the message can name the value, quote what
it got and show a good one. An absent value (an older release's values kept with
--reuse-values) is left alone: the templates fall back on their defaults. */}}

{{/* One string against a regular expression: (dict "path" "gpu.driverRoot" "value" ...
"pattern" `...` "want" "an absolute path" "example" "/run/nvidia/driver"). */}}
{{- define "gpushare.checkMatch" -}}
{{- if not (kindIs "invalid" .value) }}
{{- if not (regexMatch .pattern (toString .value)) }}
{{- fail (printf "%s %q is not %s: %s" .path (toString .value) .want .example) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A name a pod can carry in spec.schedulerName (a DNS-1123 subdomain) other than
the default scheduler's: (dict "path" "scheduler.name" "value" ...). */}}
{{- define "gpushare.checkSchedulerName" -}}
{{- include "gpushare.checkMatch" (dict "path" .path "value" .value
  "pattern" `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
  "want" "a scheduler name a pod can carry (lower-case letters, digits, '-' and '.', beginning and ending with a letter or digit)"
  "example" "e.g. gpushare-scheduler or team-a.gpu") }}
{{- if eq (toString .value) "default-scheduler" }}
{{- fail (printf "%s %q is the default scheduler's name: pods naming it must stay with the default scheduler; choose another, e.g. gpushare-scheduler" .path (toString .value)) }}
{{- end }}
{{- end }}

{{/* gpu.mockGpus as the node components read it (gpushare.inventory.parse_layout):
comma-separated COUNTxSIZEGiB[:MODEL] items, blank items skipped, count and size at
least 1, at least one GPU. */}}
{{- define "gpushare.checkMockGpus" -}}
{{- $layout := .Values.gpu.mockGpus -}}
{{- if not (kindIs "invalid" $layout) }}
{{- $item := `^\s*(0*[1-9][0-9]*\s*[xX*]\s*)?0*[1-9][0-9]*\s*(GiB|G|GB)?\s*(:\s*\S.*)?$` -}}
{{- $gpus := 0 -}}
{{- range splitList "," (toString $layout) }}
{{- if trim . }}
{{- if not (regexMatch $item .) }}
{{- $which := ne (trim .) (trim (toString $layout)) | ternary (printf " (%q is not one item)" (trim .)) "" }}
{{- fail (printf "gpu.mockGpus %q is not a GPU layout%s: write COUNTxSIZEGiB[:MODEL], comma separated, count and size at least 1, e.g. 2x16GiB or 1x24GiB:A10,1x80GiB:A100" (toString $layout) $which) }}
{{- end }}
{{- $gpus = add1 $gpus }}
{{- end }}
{{- end }}
{{- if eq $gpus 0 }}
{{- fail (printf "gpu.mockGpus %q holds no GPU: write COUNTxSIZEGiB[:MODEL], comma separated, e.g. 2x16GiB or 1x24GiB:A10,1x80GiB:A100" (toString $layout)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* What DRA mode (dra.enabled) needs of the cluster. DRA is GA in
resource.k8s.io/v1 from Kubernetes 1.34 (gate DynamicResourceAllocation); sharing a GPU
among claims needs DRAConsumableCapacity in kube-apiserver (which silently drops the
shared capacities without it) and kube-scheduler (which allocates them): alpha and off
in 1.34 and 1.35, beta and on from 1.36. */}}
{{- define "gpushare.checkDra" -}}
{{- if include "gpushare.dra" . }}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- if not (include "gpushare.draServed" .) }}
{{- $where := ternary "" " (helm template: pass --kube-version <your API server's version>)" (eq (include "gpushare.liveCluster" .) "true") -}}
{{- fail (printf "dra.enabled needs resource.k8s.io/v1 (Kubernetes 1.34 or later, where DRA is GA; gate DynamicResourceAllocation), which Kubernetes %s does not serve%s: set dra.enabled=false to keep the device plugin on every GPU node, or upgrade the cluster" $version $where) }}
{{- end }}
{{- $gate := dig "consumableCapacityGate" false .Values.dra -}}
{{- if and (include "gpushare.draSharing" .) (semverCompare "<1.36.0-0" $version) (not $gate) }}
{{- fail (printf "dra.sharing needs the feature gate DRAConsumableCapacity, alpha and off by default in Kubernetes %s (beta and on from 1.36): without it the API server drops the GPUs' shared capacities and kube-scheduler cannot share a GPU. Set dra.sharing=false (each claim gets whole GPUs), or turn DRAConsumableCapacity on in kube-apiserver and kube-scheduler and set dra.consumableCapacityGate=true" $version) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpushare.validate" -}}
{{- $absolute := `^/` -}}
{{- include "gpushare.checkMockGpus" . }}
{{- include "gpushare.checkDra" . }}
{{- include "gpushare.checkMatch" (dict "path" "gpu.runtimeClassName" "value" .Values.gpu.runtimeClassName
  "pattern" `^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
  "want" "a RuntimeClass name (lower-case letters, digits, '-' and '.')"
  "example" "e.g. nvidia, or \"\" for the node's default runtime") }}
{{- include "gpushare.checkMatch" (dict "path" "gpu.driverRoot" "value" .Values.gpu.driverRoot
  "pattern" `^(/.*)?$` "want" "an absolute path"
  "example" "e.g. /run/nvidia/driver, or \"\" where the NVIDIA container toolkit brings the driver") }}
{{- include "gpushare.checkMatch" (dict "path" "node.kubeletDir" "value" .Values.node.kubeletDir
  "pattern" $absolute "want" "an absolute path" "example" "e.g. /var/lib/kubelet") }}
{{- include "gpushare.checkMatch" (dict "path" "isolation.controlDir" "value" .Values.isolation.controlDir
  "pattern" $absolute "want" "an absolute path" "example" "e.g. /run/gpushare/cgpu") }}
{{- include "gpushare.checkMatch" (dict "path" "isolation.interposer.dir" "value" (dig "interposer" "dir" nil .Values.isolation)
  "pattern" $absolute "want" "an absolute path" "example" "e.g. /var/lib/gpushare/interposer") }}
{{- include "gpushare.checkMatch" (dict "path" "dra.cdiDir" "value" (dig "cdiDir" nil (.Values.dra | default dict))
  "pattern" $absolute "want" "an absolute path" "example" "e.g. /var/run/cdi") }}
{{- include "gpushare.checkMatch" (dict "path" "dra.stateDir" "value" (dig "stateDir" nil (.Values.dra | default dict))
  "pattern" $absolute "want" "an absolute path" "example" "e.g. /var/lib/gpushare/dra") }}
{{- include "gpushare.checkSchedulerName" (dict "path" "scheduler.name" "value" .Values.scheduler.name) }}
{{- range $i, $name := .Values.scheduler.extraSchedulerNames | default list }}
{{- include "gpushare.checkSchedulerName" (dict "path" (printf "scheduler.extraSchedulerNames[%d]" $i) "value" $name) }}
{{- end }}
{{- if eq (toString .Values.scheduler.leaderElection.resourceName) "kube-scheduler" }}
{{- fail "scheduler.leaderElection.resourceName \"kube-scheduler\" is the default scheduler's Lease: the two schedulers would take turns instead of both running; choose another, e.g. gpushare-scheduler" }}
{{- end }}
{{- include "gpushare.checkMatch" (dict "path" "extender.urlPrefix" "value" .Values.extender.urlPrefix
  "pattern" $absolute "want" "a URL path (it begins with /)" "example" "e.g. /gpushare-scheduler") }}
{{- include "gpushare.checkMatch" (dict "path" "extender.httpTimeout" "value" .Values.extender.httpTimeout
  "pattern" `^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
  "want" "a duration (numbers with a unit ms, s, m or h)" "example" "e.g. 30s or 1m30s") }}
{{- include "gpushare.checkMatch" (dict "path" "metrics.prometheusRule.runbookBaseUrl" "value" (dig "prometheusRule" "runbookBaseUrl" nil .Values.metrics)
  "pattern" `^https?://\S+$` "want" "an http(s) URL"
  "example" "e.g. https://wiki.example.com/gpushare/troubleshooting.md") }}
{{- range $i, $cidr := .Values.networkPolicy.apiServerCidrs | default list }}
{{- include "gpushare.checkMatch" (dict "path" (printf "networkPolicy.apiServerCidrs[%d]" $i) "value" $cidr
  "pattern" `^[0-9a-fA-F:.]+/[0-9]{1,3}$` "want" "a CIDR" "example" "e.g. 10.0.0.0/24 or fd00::/64") }}
{{- end }}
{{- end }}
