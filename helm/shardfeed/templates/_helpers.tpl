{{- define "shardfeed.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardfeed.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The sidecar container; include it in your own pod specs too. */}}
{{- define "shardfeed.sidecar" -}}
- name: shardfeed
  image: "{{ .Values.shardfeed.image.repository }}:{{ .Values.shardfeed.image.tag }}"
  imagePullPolicy: {{ .Values.shardfeed.image.pullPolicy }}
  args: ["serve"]
  env:
    - name: SHARDFEED_LISTEN
      value: unix:/run/shardfeed/shardfeed.sock
    - name: SHARDFEED_METRICS_LISTEN
      value: "0.0.0.0:{{ .Values.shardfeed.metricsPort }}"
    - name: SHARDFEED_MAX_STREAMS
      value: {{ .Values.shardfeed.maxStreams | quote }}
    - name: SHARDFEED_PART_SIZE
      value: {{ .Values.shardfeed.partSize | quote }}
    - name: SHARDFEED_PARTS_IN_FLIGHT
      value: {{ .Values.shardfeed.partsInFlight | quote }}
    - name: SHARDFEED_SHUTDOWN_GRACE
      value: {{ .Values.shardfeed.shutdownGraceSeconds | quote }}
    - name: SHARDFEED_LOG_FORMAT
      value: {{ .Values.shardfeed.logFormat | quote }}
    {{- with .Values.shardfeed.decodeThreads }}
    - name: SHARDFEED_DECODE_THREADS
      value: {{ . | quote }}
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
      containerPort: {{ .Values.shardfeed.metricsPort }}
  # gRPC health over the Unix socket (NOT_SERVING while draining).
  readinessProbe:
    exec:
      command: ["/usr/local/bin/shardfeed", "health"]
    periodSeconds: 5
  resources:
    {{- toYaml .Values.shardfeed.resources | nindent 4 }}
  volumeMounts:
    - name: shardfeed-socket
      mountPath: /run/shardfeed
{{- end -}}
