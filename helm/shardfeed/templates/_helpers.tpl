{{- define "shardfeed.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardfeed.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shardfeed.labels" -}}
{{ include "shardfeed.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The decode pool's Deployment and headless Service. */}}
{{- define "shardfeed.poolName" -}}
{{- printf "%s-pool" (include "shardfeed.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Pool pods are not training pods: another name, so the training
PodDisruptionBudget and rendezvous Service never select them. */}}
{{- define "shardfeed.poolSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-pool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: decode-pool
{{- end -}}

{{- define "shardfeed.poolLabels" -}}
{{ include "shardfeed.poolSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "shardfeed.poolTlsSecret" -}}
{{- default (printf "%s-pool-tls" (include "shardfeed.fullname" .)) .Values.pool.tls.existingSecret -}}
{{- end -}}

{{- define "shardfeed.poolTokenSecret" -}}
{{- default (printf "%s-pool-token" (include "shardfeed.fullname" .)) .Values.pool.token.existingSecret -}}
{{- end -}}

{{- define "shardfeed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shardfeed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pods in the training world. */}}
{{- define "shardfeed.nodes" -}}
{{- if eq .Values.workloadKind "Job" -}}
{{- .Values.job.parallelism -}}
{{- else if eq .Values.workloadKind "JobSet" -}}
{{- mul .Values.jobSet.replicas .Values.jobSet.parallelism -}}
{{- else if eq .Values.workloadKind "TrainingRuntime" -}}
{{- .Values.trainingRuntime.numNodes -}}
{{- else -}}
{{- add 1 .Values.pytorchJob.workers -}}
{{- end -}}
{{- end -}}

{{/*
Where torchrun's c10d rendezvous runs: the first pod, by its DNS name under
the headless Service (Job) or the JobSet's own subdomain.
*/}}
{{- define "shardfeed.rendezvousHost" -}}
{{- $name := include "shardfeed.fullname" . -}}
{{- if eq .Values.workloadKind "JobSet" -}}
{{- printf "%s-trainer-0-0.%s" $name $name -}}
{{- else -}}
{{- printf "%s-0.%s" $name $name -}}
{{- end -}}
{{- end -}}

{{/* Whether an operator gives torchrun its world (PyTorchJob, Kubeflow
Trainer): then the chart sets no rendezvous env or port of its own. */}}
{{- define "shardfeed.operatorSetsWorld" -}}
{{- has .Values.workloadKind (list "PyTorchJob" "TrainingRuntime") -}}
{{- end -}}

{{/* The pod template of every workload kind. `restartPolicy` is the pod's. */}}
{{- define "shardfeed.podTemplate" -}}
{{- $values := .root.Values -}}
{{- /* Metrics leave loopback only for the PodMonitor that scrapes them. */ -}}
{{- $sidecar := set (deepCopy $values.shardfeed) "scrapeMetrics" $values.podMonitor.enabled -}}
{{- /* The chart's own pool: its Service and token, unless set by hand. */ -}}
{{- if $values.pool.enabled -}}
{{- $pool := $sidecar.pool -}}
{{- $_ := set $pool "address" (default (printf "%s:%d" (include "shardfeed.poolName" .root) (int $values.pool.port)) $pool.address) -}}
{{- $_ := set $pool "tokenSecret" (default (include "shardfeed.poolTokenSecret" .root) $pool.tokenSecret) -}}
{{- if $values.pool.tls.enabled -}}
{{- $_ := set $pool "tlsSecret" (default (include "shardfeed.poolTlsSecret" .root) $pool.tlsSecret) -}}
{{- else -}}
{{- $_ := set $pool "insecurePlaintext" true -}}
{{- end -}}
{{- end -}}
metadata:
  labels:
    {{- include "shardfeed.labels" .root | nindent 4 }}
    {{- with $values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  restartPolicy: {{ .restartPolicy }}
  serviceAccountName: {{ include "shardfeed.serviceAccountName" .root }}
  {{- if and (eq $values.workloadKind "Job") (gt (int $values.job.parallelism) 1) }}
  # Pods are <job>-<index>.<subdomain>: the rendezvous finds pod 0 by name.
  subdomain: {{ include "shardfeed.fullname" .root }}
  {{- end }}
  terminationGracePeriodSeconds: {{ include "shardfeed-sidecar.terminationGracePeriodSeconds" $sidecar }}
  securityContext:
    {{- toYaml $values.podSecurityContext | nindent 4 }}
  {{- with $values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- with $values.schedulerName }}
  schedulerName: {{ . | quote }}
  {{- end }}
  initContainers:
    {{- include "shardfeed-sidecar.initContainers" $sidecar | nindent 4 }}
  containers:
    # PyTorchJob requires its container to be named pytorch, the Trainer node.
    - name: {{ .container | default "trainer" }}
      image: {{ $values.trainer.image | quote }}
      {{- with $values.trainer.command }}
      command:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.trainer.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        {{- include "shardfeed-sidecar.trainerEnv" $sidecar | nindent 8 }}
        {{- if ne (include "shardfeed.operatorSetsWorld" .root) "true" }}
        # The world for torchrun (the PyTorchJob and Trainer operators set
        # their own):
        # --nnodes=$(NNODES) --rdzv-backend=c10d
        # --rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)
        - name: NNODES
          value: {{ include "shardfeed.nodes" .root | quote }}
        - name: MASTER_ADDR
          value: {{ include "shardfeed.rendezvousHost" .root | quote }}
        - name: MASTER_PORT
          value: {{ $values.rendezvous.port | int64 | quote }}
        {{- end }}
        {{- with $values.trainer.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if ne (include "shardfeed.operatorSetsWorld" .root) "true" }}
      ports:
        - name: rendezvous
          containerPort: {{ $values.rendezvous.port | int64 }}
          protocol: TCP
      {{- end }}
      resources:
        {{- toYaml $values.trainer.resources | nindent 8 }}
      securityContext:
        {{- toYaml $values.trainer.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "shardfeed-sidecar.trainerVolumeMounts" $sidecar | nindent 8 }}
        {{- if $values.trainer.shmSize }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- with $values.trainer.volumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- include "shardfeed-sidecar.volumes" $sidecar | nindent 4 }}
    {{- with $values.trainer.shmSize }}
    # The runtime's /dev/shm is 64 MiB: too small for NCCL and DataLoader workers.
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ . | quote }}
    {{- end }}
    {{- with $values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The workload's metadata: the chart's labels, the kind's own
(`labels`) and the user's. */}}
{{- define "shardfeed.workloadMetadata" -}}
name: {{ include "shardfeed.fullname" .root }}
labels:
  {{- include "shardfeed.labels" .root | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .root.Values.workloadLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.workloadAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
