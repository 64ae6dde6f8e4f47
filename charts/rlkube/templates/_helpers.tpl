{{/* Names and labels shared by every template. */}}

{{- define "rlkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, used for every object it creates. Cluster-scoped objects
(ClusterRoles, ClusterRoleBindings) are named after it too, so two releases need two
release names.
*/}}
{{- define "rlkube.fullname" -}}
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

{{- define "rlkube.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rlkube.labels" -}}
helm.sh/chart: {{ include "rlkube.chart" . }}
{{ include "rlkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rlkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlkube.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's ServiceAccount as the subject of its bindings. */}}
{{- define "rlkube.subject" -}}
- kind: ServiceAccount
  name: {{ include "rlkube.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{- define "rlkube.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Lease the replicas elect their leader with, in the release namespace. */}}
{{- define "rlkube.leaseName" -}}
{{- printf "%s-leader" (include "rlkube.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The operator's command line (rlkube_operator/__main__.py): its scope, ports and log level.
*/}}
{{- define "rlkube.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --metrics-port={{ .Values.metrics.port }}
- --health-port={{ .Values.health.port }}
{{- with .Values.leaderElection }}
{{- if .enabled }}
- --leader-elect
- --lease-name={{ include "rlkube.leaseName" $ }}
- --lease-duration={{ .leaseDurationSeconds }}
- --renew-every={{ .renewPeriodSeconds }}
- --retry-every={{ .retryPeriodSeconds }}
{{- end }}
{{- end }}
{{- if eq .Values.logLevel "debug" }}
- --verbose
{{- end }}
{{- end }}

{{/*
What the operator does to the API server, in a watched namespace (or, cluster-wide,
in every namespace). Every verb below is one the operator's code makes; nothing is
a wildcard. Children are written with server-side apply, a PATCH that also needs
`create` when the object does not exist yet. tests/chart/test_rbac.py holds the
same list as a table, and README.md documents it.
*/}}
{{- define "rlkube.jobRules" -}}
# kopf lists and watches RLJobs; the operator writes only their status.
- apiGroups: ["rlkube.dev"]
  resources: ["rljobs"]
  verbs: ["list", "watch"]
# The runtimes jobs name (spec.runtimeRef): read when a job is first resolved, watched to
# start the jobs held for one.
- apiGroups: ["rlkube.dev"]
  resources: ["rljobruntimes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["rlkube.dev"]
  resources: ["rljobs/status"]
  verbs: ["patch"]
# Children carry a controller ownerReference with blockOwnerDeletion; clusters that
# enable the OwnerReferencesPermissionEnforcement admission plugin (OpenShift does)
# require update on the owner's finalizers to set it.
- apiGroups: ["rlkube.dev"]
  resources: ["rljobs/finalizers"]
  verbs: ["update"]
# Pods: indexed and watched (list, watch), deleted for a gang restart (delete).
# get and patch only because the operator creates, for each job, a Role that lets
# the driver get/patch its own pod: RBAC forbids granting a permission one does not
# hold. Holding these two is far narrower than `escalate`/`bind`, which would let
# the operator grant anything.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# One StatefulSet per role: applied (create, patch), indexed (list, watch), scaled
# to zero when the job ends (patch) and deleted after ttlSecondsAfterFinished.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["create", "patch", "list", "watch", "delete"]
# The other children: applied (create, patch); listed by label and deleted after
# ttlSecondsAfterFinished.
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["create", "patch", "list", "delete"]
# The job's Ray token Secret: created once (never applied, so never rotated under
# running pods) and deleted by name. No get, list or watch: the operator reads no
# Secret. create with dryRun also tells whether a Secret the pods name exists (409).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "delete"]
# The ConfigMaps and PersistentVolumeClaims a job's pods name (the reward function, volumes,
# env): looked up by name (get, metadata only) before its pods are created, so that none
# is created while one is missing. Also reads the job's exit-record ConfigMap.
- apiGroups: [""]
  resources: ["configmaps", "persistentvolumeclaims"]
  verbs: ["get"]
# The driver's Role and RoleBinding (see pods above).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch", "list", "delete"]
# The job's NetworkPolicy (spec.networkPolicy): applied, listed by label and deleted after
# ttlSecondsAfterFinished.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch", "list", "delete"]
# Gang scheduling: Volcano and scheduler-plugins coscheduling PodGroups. Both are
# granted whichever scheduler is in use: the TTL cleanup lists both kinds, and a
# PodGroup CRD that is installed but forbidden would make it fail. Kueue needs no
# object of its own (labels and spec.suspend only).
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["create", "patch", "list", "delete"]
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["create", "patch", "list", "delete"]
# Events on RLJobs (kopf.event posts them; it never updates one); listed for a pod whose
# containers never start, to put the kubelet's reason (FailedMount, ...) into the job's condition.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}

{{/*
kopf's runtime observation (rbac.kopfObservation): it watches CRDs to notice
resources appear, change or go; when it watches a list of namespaces, it also
lists and watches Namespaces to notice them appear or go. Cluster-wide it never
looks at Namespaces. kopf's peering objects are not needed: the operator runs
standalone (leader election uses a Lease, rlkube.leaderElectionRules).
*/}}
{{/*
The cluster-wide runtimes (ClusterRLJobRuntime), cluster-scoped: read and watched in both
modes, as the namespaced runtimes are in the watched namespaces. Read only.
*/}}
{{- define "rlkube.clusterRuntimeRules" -}}
- apiGroups: ["rlkube.dev"]
  resources: ["clusterrljobruntimes"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{- define "rlkube.observationRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/*
Leader election (leaderElection.enabled), in the release namespace only: create the
Lease once, then read and renew only that one (resourceNames cannot narrow create).
*/}}
{{- define "rlkube.leaderElectionRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "rlkube.leaseName" . | quote }}]
  verbs: ["get", "update"]
{{- end }}
