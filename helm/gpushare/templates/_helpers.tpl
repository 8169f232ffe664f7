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

{{/* "true" when image.repository is the chart's default, docker.io/gpushare/gpushare
(however written): the release's image archive carries that reference, and no
registry serves it, so the nodes must have been given the image. */}}
{{- define "gpushare.imageIsPlaceholder" -}}
{{- $repository := .Values.image.repository | trimPrefix "docker.io/" | trimPrefix "index.docker.io/" -}}
{{- if eq $repository "gpushare/gpushare" }}true{{ end -}}
{{- end }}

{{/* "true" when the chart is rendered against a live cluster (helm install or
upgrade): Helm then fills .Capabilities.APIVersions from the API server's discovery,
which lists each kind (v1/Node); `helm template` has only Helm's built-in group
versions (and whatever --api-versions adds), and its KubeVersion is --kube-version or
Helm's own default, not the cluster's. */}}
{{- define "gpushare.liveCluster" -}}
{{- if .Capabilities.APIVersions.Has "v1/Node" }}true{{ end -}}
{{- end }}

{{/* The kube-scheduler tag: scheduler.image.tag when set, else the API server's own
version, major.minor.patch. The version skew policy wants kube-scheduler no newer than
the API server, of its minor version or one older: the API server's own release is both.
A provider's suffix (v1.30.2-eks-1552ad0, v1.30.5-gke.1014001, v1.30.2+k3s1) is no
upstream image and is dropped; an upstream pre-release (v1.34.0-rc.1) is kept, being
published under that tag and older than v1.34.0. */}}
{{- define "gpushare.schedulerTag" -}}
{{- if .Values.scheduler.image.tag }}{{ .Values.scheduler.image.tag }}
{{- else }}
{{- $version := semver .Capabilities.KubeVersion.Version -}}
{{- $tag := printf "v%d.%d.%d" $version.Major $version.Minor $version.Patch -}}
{{- if regexMatch `^(alpha|beta|rc)\.[0-9]+$` $version.Prerelease }}
{{- $tag = printf "%s-%s" $tag $version.Prerelease }}
{{- end }}
{{- $tag }}
{{- end }}
{{- end }}

{{/* The stock kube-scheduler, by default of the cluster's own version. */}}
{{- define "gpushare.schedulerImage" -}}
{{- printf "%s:%s" .Values.scheduler.image.repository (include "gpushare.schedulerTag" .) }}
{{- end }}

{{/* Why this kube-scheduler image, for NOTES.txt: where its version comes from and,
when scheduler.image.tag pins one outside the skew policy, a warning. */}}
{{- define "gpushare.schedulerImageNotes" -}}
{{- $cluster := .Capabilities.KubeVersion.Version -}}
{{- $image := include "gpushare.schedulerImage" . -}}
{{- $live := include "gpushare.liveCluster" . -}}
{{- if .Values.scheduler.image.tag }}
The scheduler runs {{ $image }}, pinned by scheduler.image.tag
{{- if $live }} (the cluster runs Kubernetes {{ $cluster }}).{{ else }}.{{ end }}
{{- $pinned := .Values.scheduler.image.tag | trimPrefix "v" -}}
{{- if and $live (regexMatch `^[0-9]+\.[0-9]+\.[0-9]+` $pinned) }}
{{- $p := semver (regexFind `^[0-9]+\.[0-9]+\.[0-9]+` $pinned) -}}
{{- $c := semver $cluster -}}
{{- if or (gt $p.Major $c.Major) (and (eq $p.Major $c.Major) (gt $p.Minor $c.Minor)) }}

WARNING: kube-scheduler {{ .Values.scheduler.image.tag }} is newer than the API server ({{ $cluster }}):
the version skew policy forbids it, and it may ask for APIs this cluster does not
serve. Unset scheduler.image.tag to follow the cluster, or pin v{{ $c.Major }}.{{ $c.Minor }}.x.
{{- else if or (lt $p.Major $c.Major) (lt $p.Minor (sub $c.Minor 1)) }}

WARNING: kube-scheduler {{ .Values.scheduler.image.tag }} is more than one minor version older than
the API server ({{ $cluster }}), outside the version skew policy. Unset
scheduler.image.tag to follow the cluster, or pin v{{ $c.Major }}.{{ $c.Minor }}.x.
{{- end }}
{{- end }}
{{- else if $live }}
The scheduler runs {{ $image }}: it follows the cluster's Kubernetes {{ $cluster }}
(set scheduler.image.tag to pin it; `helm upgrade` after a cluster upgrade follows again).
{{- else }}
The scheduler runs {{ $image }}, from Kubernetes {{ $cluster }}.

WARNING: rendered without a cluster (helm template): {{ $cluster }} is --kube-version or, without it,
Helm's built-in default, not necessarily your cluster's. Render with
--kube-version <your API server's version> (kubectl version) or set scheduler.image.tag;
the webhook's matchConditions and the device plugin's admission policy follow it too.
{{- end }}
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

{{/* The placement policies the extender knows (gpushare.placement.policies.POLICIES),
sorted, space separated: what the notes offer. Templates cannot read values.schema.json,
whose extender.defaultPlacement enum lists them too; tests/chart pins both to POLICIES. */}}
{{- define "gpushare.placementPolicies" -}}
bestfit binpack fgd fgd-lookahead spread
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

{{/* ----- The GPU node pods: the node DaemonSet (device plugin) and, in DRA mode, the
DRA DaemonSet (the DRA driver) share the isolation agent, the host volumes and how a
kubelet plugin container runs. */}}

{{/* The nodeSelectorTerms of the GPU-sharing nodes: the mode label, or one of the
legacy labels (terms are ORed). (dict "driver" "In"|"NotIn"|""): with In or NotIn,
each term also asks gpushare.io/driver to be (or not be) dra, so a node runs the
device plugin or the DRA driver, never both: the two would advertise the same GPUs. */}}
{{- define "gpushare.gpuNodeTerms" -}}
{{- $driver := .driver -}}
{{- range $term := list
  (dict "key" "ack.node.gpu.schedule" "values" "[share, cgpu, core_mem]")
  (dict "key" "gpushare" "values" "[\"true\"]")
  (dict "key" "cgpu" "values" "[\"true\"]") }}
- matchExpressions:
    - key: {{ $term.key }}
      operator: In
      values: {{ $term.values }}
    {{- if $driver }}
    - key: gpushare.io/driver
      operator: {{ $driver }}
      values: [dra]
    {{- end }}
{{- end }}
{{- end }}

{{/* The operator of gpushare.io/driver in the node DaemonSet's terms: NotIn with DRA
mode (nodes labelled dra run the DRA DaemonSet instead), none without. */}}
{{- define "gpushare.devicePluginDriverTerm" -}}
{{- if include "gpushare.dra" . }}NotIn{{ end -}}
{{- end }}

{{/* How a kubelet plugin container (the device plugin, the DRA driver) runs: root to
own its sockets in the kubelet's root-owned directories, nothing more unless
gpu.driverRoot leaves only privileged to open /dev/nvidia*. */}}
{{- define "gpushare.pluginSecurityContext" -}}
runAsUser: 0
runAsNonRoot: false
{{- if and (ne .Values.gpu.backend "mock") .Values.gpu.driverRoot }}
# No toolkit grants the container /dev/nvidia*, which NVML opens.
privileged: true
{{- else }}
# Root only to own its socket in the kubelet's root-owned directory; no
# capabilities, no escalation.
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end }}
readOnlyRootFilesystem: true
{{- end }}

{{/* The mounts a kubelet plugin container shares with the other (the device plugin's,
the DRA driver's): /tmp, its API token, the interposer directory, the node's /dev
and the driver's root. */}}
{{- define "gpushare.pluginMounts" -}}
{{- $interposer := and .Values.isolation.enabled .Values.isolation.interposer.enabled -}}
- name: tmp
  mountPath: /tmp
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- if $interposer }}
# At the node's own path: Allocate names host paths under it in its mounts.
- name: interposer
  mountPath: {{ .Values.isolation.interposer.dir }}
{{- end }}
{{- if ne .Values.gpu.backend "mock" }}
# The node's /dev (--dev-root): which of nvidiactl, nvidia-uvm,
# nvidia-uvm-tools and nvidia-modeset the node has, for the Allocate answers.
- name: host-dev
  mountPath: /host/dev
  readOnly: true
  {{- if semverCompare ">=1.31.0-0" .Capabilities.KubeVersion.Version }}
  recursiveReadOnly: IfPossible
  {{- end }}
{{- end }}
{{- include "gpushare.driverRootMount" . | nindent 0 }}
{{- end }}

{{/* The isolation agent, alike in both node DaemonSets: it enforces the caps whichever
plugin (device plugin or DRA driver) handed the container its GPU. */}}
{{- define "gpushare.isolationContainer" -}}
{{- $interposer := and .Values.isolation.enabled .Values.isolation.interposer.enabled -}}
- name: isolation
  image: {{ include "gpushare.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [gpushare-isolation]
  args:
    {{- include "gpushare.backendArgs" . | nindent 4 }}
    - --control-dir={{ .Values.isolation.controlDir }}
    - --proc-root=/host/proc
    - --cgroup-root=/host/sys/fs/cgroup
    - --metrics-port={{ .Values.isolation.metricsPort }}
    - --memory-action={{ .Values.isolation.memoryAction }}
    - --backstop-slack-per-process-mib={{ .Values.isolation.backstopSlack.perProcessMiB }}
    - --backstop-slack-max-mib={{ .Values.isolation.backstopSlack.maxMiB }}
    - --interposer-dir={{ if $interposer }}{{ .Values.isolation.interposer.dir }}{{ end }}
    {{- with .Values.isolation.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    {{- include "gpushare.nodeEnv" . | nindent 4 }}
    - name: GPUSHARE_CONTROL_DIR
      value: {{ .Values.isolation.controlDir | quote }}
  {{- if gt (int .Values.isolation.metricsPort) 0 }}
  ports:
    - name: agent-metrics
      containerPort: {{ .Values.isolation.metricsPort }}
      protocol: TCP
  {{- end }}
  # Freezing a container's cgroup, stopping or killing its processes and
  # reading their /proc/<pid>/environ need root over other containers.
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    {{- if .Values.isolation.privileged }}
    privileged: true
    {{- else }}
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [KILL, SYS_PTRACE, DAC_OVERRIDE]
    {{- end }}
    readOnlyRootFilesystem: true
  resources:
    {{- toYaml .Values.isolation.resources | nindent 4 }}
  volumeMounts:
    - name: control-dir
      mountPath: {{ .Values.isolation.controlDir }}
    - name: host-proc
      mountPath: /host/proc
      readOnly: true
    - name: host-cgroup
      mountPath: /host/sys/fs/cgroup
    - name: tmp
      mountPath: /tmp
    {{- if $interposer }}
    - name: interposer
      mountPath: {{ .Values.isolation.interposer.dir }}
    {{- end }}
    {{- include "gpushare.driverRootMount" . | nindent 4 }}
{{- end }}

{{/* The volumes both node DaemonSets give their pods besides the kubelet's
directories: /tmp, the plugin's API token (projected: the pod mounts none by
default), the node's /dev, the driver's root, the interposer directory and the
agent's host paths. */}}
{{- define "gpushare.nodePodVolumes" -}}
{{- $nvml := ne .Values.gpu.backend "mock" -}}
{{- $interposer := and .Values.isolation.enabled .Values.isolation.interposer.enabled -}}
- name: tmp
  emptyDir: {}
- name: kube-api-access
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- if $nvml }}
- name: host-dev
  hostPath:
    path: /dev
    type: Directory
{{- end }}
{{- if and $nvml .Values.gpu.driverRoot }}
- name: driver-root
  hostPath:
    path: {{ .Values.gpu.driverRoot }}
    type: Directory
{{- end }}
{{- if $interposer }}
- name: interposer
  hostPath:
    path: {{ .Values.isolation.interposer.dir }}
    type: DirectoryOrCreate
{{- end }}
{{- if .Values.isolation.enabled }}
- name: control-dir
  hostPath:
    path: {{ .Values.isolation.controlDir }}
    type: DirectoryOrCreate
- name: host-proc
  hostPath:
    path: /proc
    type: Directory
- name: host-cgroup
  hostPath:
    path: /sys/fs/cgroup
    type: Directory
{{- end }}
{{- end }}

{{/* ----- DRA mode (dra.*) */}}

{{/* "true" when dra.enabled. Absent (values of an older release kept with
--reuse-values) counts as off: the chart renders as before DRA mode. */}}
{{- define "gpushare.dra" -}}
{{- if dig "enabled" false (.Values.dra | default dict) }}true{{ end -}}
{{- end }}

{{/* "true" when DRA mode shares GPUs among claims (dra.sharing; unset counts as on),
"" when each claim gets whole GPUs. */}}
{{- define "gpushare.draSharing" -}}
{{- if and (include "gpushare.dra" .) (ne (toString (dig "sharing" true .Values.dra)) "false") }}true{{ end -}}
{{- end }}

{{/* "true" when the webhook turns pods that ask aliyun.com/gpu-* into pods with a
claim of the driver's DeviceClass (the extender's --dra-claims): DRA mode,
dra.convertAckPods (unset counts as on) and the webhook that does it. */}}
{{- define "gpushare.draClaims" -}}
{{- if and (include "gpushare.dra" .) (ne (toString (dig "convertAckPods" true .Values.dra)) "false") .Values.webhook.enabled }}true{{ end -}}
{{- end }}

{{/* The DRA driver's name: ResourceSlice spec.driver, the DeviceClass's name, the
kubelet plugin directory, the CDI vendor (gpushare.dra.claims.DRIVER). */}}
{{- define "gpushare.draDriver" -}}
gpu.gpushare.io
{{- end }}

{{/* "true" when the cluster serves resource.k8s.io/v1, where DRA is GA (Kubernetes
1.34, gate DynamicResourceAllocation). Against a live cluster (helm install, upgrade)
discovery tells: its APIVersions list each kind (resource.k8s.io/v1/DeviceClass).
`helm template` has Helm's built-in group versions, resource.k8s.io/v1 among them
whatever the cluster, so there the version (--kube-version) tells. */}}
{{- define "gpushare.draServed" -}}
{{- if include "gpushare.liveCluster" . }}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" }}true{{ end -}}
{{- else if and (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version) }}true{{ end -}}
{{- end }}

{{/* "true" where the API server authorizes a claim's status by part
(DRAResourceClaimGranularStatusAuthorization, beta and on from 1.36): writing the
allocation then also takes resourceclaims/binding, which our kube-scheduler needs. */}}
{{- define "gpushare.draGranularStatus" -}}
{{- if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- end }}

{{/* "true" where kube-scheduler must be told to turn DRAConsumableCapacity on: DRA
mode shares GPUs (dra.sharing) below 1.36, where the gate is alpha and off (1.36:
beta, on). _validate.tpl has refused this unless dra.consumableCapacityGate says the
cluster's own kube-apiserver and kube-scheduler have it on. */}}
{{- define "gpushare.draCapacityGateFlag" -}}
{{- if and (include "gpushare.draSharing" .) (semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version) }}true{{ end -}}
{{- end }}

{{/* "true" when the ValidatingAdmissionPolicy keeping the DRA driver's account to its
own node's ResourceSlices is rendered: DRA mode and dra.ownNodePolicy (unset counts
as on). DRA mode needs 1.34, past the 1.30 that node-admission-policy.yaml waits for. */}}
{{- define "gpushare.draOwnNodePolicy" -}}
{{- if and (include "gpushare.dra" .) (ne (toString (dig "ownNodePolicy" true .Values.dra)) "false") }}true{{ end -}}
{{- end }}

{{/* ----- The own-node admission policies (node-admission-policy.yaml for the device
plugin, dra-admission-policy.yaml for the DRA driver): a GPU node's plugin may change
only its own Node and the pods bound to that node. */}}

{{/* The policy variable `node`: the node the request's token names (the user's extra
authentication.kubernetes.io/node-name), '' when it names none. */}}
{{- define "gpushare.ownNodeVariable" -}}
{{- $nodeKey := "authentication.kubernetes.io/node-name" -}}
- name: node
  expression: >-
    has(request.userInfo.extra) && '{{ $nodeKey }}' in request.userInfo.extra
    && size(request.userInfo.extra['{{ $nodeKey }}']) == 1
    ? request.userInfo.extra['{{ $nodeKey }}'][0] : ''
{{- end }}

{{/* The validations: a token naming a node, and of Nodes and pods only that node's.
(dict "who" "the device plugin"), as the messages name the account's component. */}}
{{- define "gpushare.ownNodeValidations" -}}
- expression: variables.node != ''
  message: >-
    {{ .who }}'s token names no node (authentication.kubernetes.io/node-name):
    use the token the kubelet mounts into its pod, on Kubernetes >= 1.30 with
    ServiceAccountTokenPodNodeInfo on
  reason: Forbidden
- expression: >-
    variables.node == '' || request.resource.resource != 'nodes'
    || oldObject.metadata.name == variables.node
  messageExpression: >-
    '{{ .who }} of node ' + variables.node + ' may change only its own Node, not '
    + oldObject.metadata.name
  reason: Forbidden
- expression: >-
    variables.node == '' || request.resource.resource != 'pods'
    || (has(oldObject.spec.nodeName) && oldObject.spec.nodeName == variables.node)
  messageExpression: >-
    '{{ .who }} of node ' + variables.node + ' may change only pods bound to it, not '
    + oldObject.metadata.namespace + '/' + oldObject.metadata.name + ' ('
    + (has(oldObject.spec.nodeName) ? 'bound to ' + oldObject.spec.nodeName : 'not bound') + ')'
  reason: Forbidden
{{- end }}
