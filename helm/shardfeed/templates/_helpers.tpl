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

{{- define "shardfeed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shardfeed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Bytes of the cache volume: --cache-size plus the headroom. */}}
{{- define "shardfeed.cacheLimitGi" -}}
{{- $size := int .Values.shardfeed.cache.sizeGi -}}
{{- add $size (div (add (mul $size (int .Values.shardfeed.cache.headroomPercent)) 99) 100) -}}
{{- end -}}

{{/* The shardfeed native sidecar: an init container that keeps running. */}}
{{- define "shardfeed.sidecar" -}}
- name: shardfeed
  image: "{{ .Values.shardfeed.image.repository }}:{{ .Values.shardfeed.image.tag }}"
  imagePullPolicy: {{ .Values.shardfeed.image.pullPolicy }}
  restartPolicy: Always
  args: ["serve"]
  env:
    - name: SHARDFEED_LISTEN
      value: unix:/run/shardfeed/shardfeed.sock
    - name: SHARDFEED_METRICS_LISTEN
      value: "0.0.0.0:{{ .Values.shardfeed.metricsPort | int64 }}"
    - name: SHARDFEED_MAX_STREAMS
      value: {{ .Values.shardfeed.maxStreams | int64 | quote }}
    - name: SHARDFEED_PART_SIZE
      value: {{ .Values.shardfeed.partSize | int64 | quote }}
    - name: SHARDFEED_PARTS_IN_FLIGHT
      value: {{ .Values.shardfeed.partsInFlight | int64 | quote }}
    - name: SHARDFEED_SHUTDOWN_GRACE
      value: {{ .Values.shardfeed.shutdownGraceSeconds | int64 | quote }}
    # The container's own limit, in bytes, from the Downward API: the budget
    # then never depends on how the node lays out its cgroups.
    - name: SHARDFEED_MEMORY_LIMIT
      valueFrom:
        resourceFieldRef:
          containerName: shardfeed
          resource: limits.memory
    - name: SHARDFEED_LOG_FORMAT
      value: {{ .Values.shardfeed.logFormat | quote }}
    - name: SHARDFEED_LOG
      value: {{ .Values.shardfeed.logLevel | quote }}
    {{- with .Values.shardfeed.allow }}
    - name: SHARDFEED_ALLOW
      value: {{ join "," . | quote }}
    {{- end }}
    {{- with .Values.shardfeed.decodeThreads }}
    - name: SHARDFEED_DECODE_THREADS
      value: {{ . | quote }}
    {{- end }}
    {{- if .Values.shardfeed.cache.enabled }}
    - name: SHARDFEED_CACHE_DIR
      value: /var/cache/shardfeed
    - name: SHARDFEED_CACHE_SIZE
      value: "{{ .Values.shardfeed.cache.sizeGi }}Gi"
    {{- end }}
    {{- with .Values.shardfeed.s3.region }}
    - name: AWS_REGION
      value: {{ . | quote }}
    {{- end }}
    {{- with .Values.shardfeed.s3.endpoint }}
    - name: SHARDFEED_S3_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    {{- if .Values.shardfeed.s3.forcePathStyle }}
    - name: SHARDFEED_S3_FORCE_PATH_STYLE
      value: "true"
    {{- end }}
    {{- with .Values.shardfeed.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: metrics
      containerPort: {{ .Values.shardfeed.metricsPort | int64 }}
      protocol: TCP
  # gRPC health over the Unix socket: the trainer starts once this passes.
  startupProbe:
    exec:
      command: ["/usr/local/bin/shardfeed", "health"]
    periodSeconds: {{ .Values.shardfeed.probes.startup.periodSeconds }}
    failureThreshold: {{ .Values.shardfeed.probes.startup.failureThreshold }}
  # NOT_SERVING while draining. No liveness probe: a restart mid-epoch ends
  # every rank's stream, and a stuck S3 read already ends with a status.
  readinessProbe:
    exec:
      command: ["/usr/local/bin/shardfeed", "health"]
    periodSeconds: {{ .Values.shardfeed.probes.readiness.periodSeconds }}
    failureThreshold: {{ .Values.shardfeed.probes.readiness.failureThreshold }}
  resources:
    {{- toYaml .Values.shardfeed.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.shardfeed.securityContext | nindent 4 }}
  volumeMounts:
    - name: shardfeed-socket
      mountPath: /run/shardfeed
    {{- if .Values.shardfeed.cache.enabled }}
    - name: shardfeed-cache
      mountPath: /var/cache/shardfeed
    {{- end }}
{{- end -}}

{{/* The pod template of every workload kind. `restartPolicy` is the pod's. */}}
{{- define "shardfeed.podTemplate" -}}
metadata:
  labels:
    {{- include "shardfeed.labels" .root | nindent 4 }}
    {{- with .root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .root.Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  restartPolicy: {{ .restartPolicy }}
  serviceAccountName: {{ include "shardfeed.serviceAccountName" .root }}
  # The drain needs its grace period, plus time to exit.
  terminationGracePeriodSeconds: {{ add .root.Values.shardfeed.shutdownGraceSeconds 10 }}
  securityContext:
    {{- toYaml .root.Values.podSecurityContext | nindent 4 }}
  initContainers:
    {{- include "shardfeed.sidecar" .root | nindent 4 }}
  containers:
    # PyTorchJob requires its container to be named pytorch.
    - name: {{ .container | default "trainer" }}
      image: {{ .root.Values.trainer.image | quote }}
      {{- with .root.Values.trainer.command }}
      command:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .root.Values.trainer.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        - name: SHARDFEED_TARGET
          value: unix:///run/shardfeed/shardfeed.sock
        {{- with .root.Values.trainer.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- toYaml .root.Values.trainer.resources | nindent 8 }}
      securityContext:
        {{- toYaml .root.Values.trainer.securityContext | nindent 8 }}
      volumeMounts:
        - name: shardfeed-socket
          mountPath: /run/shardfeed
        {{- with .root.Values.trainer.volumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: shardfeed-socket
      emptyDir:
        medium: Memory
        sizeLimit: 1Mi
    {{- if .root.Values.shardfeed.cache.enabled }}
    {{- if eq .root.Values.shardfeed.cache.volume "ephemeral" }}
    - name: shardfeed-cache
      ephemeral:
        volumeClaimTemplate:
          spec:
            accessModes: ["ReadWriteOnce"]
            {{- with .root.Values.shardfeed.cache.storageClassName }}
            storageClassName: {{ . | quote }}
            {{- end }}
            resources:
              requests:
                storage: "{{ include "shardfeed.cacheLimitGi" .root }}Gi"
    {{- else }}
    - name: shardfeed-cache
      emptyDir:
        sizeLimit: "{{ include "shardfeed.cacheLimitGi" .root }}Gi"
    {{- end }}
    {{- end }}
    {{- with .root.Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .root.Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .root.Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .root.Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
