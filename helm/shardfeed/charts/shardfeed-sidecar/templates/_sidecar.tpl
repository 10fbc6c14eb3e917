{{/*
The shardfeed sidecar: its one definition, for the shardfeed chart and for
yours. Every template takes the sidecar's settings, this chart's values
merged with yours: `.Values.shardfeed` when you depend on this chart under
the alias `shardfeed` (README.md shows the pod template).
*/}}

{{/* The socket the sidecar serves and the trainer dials. */}}
{{- define "shardfeed-sidecar.socketDir" -}}
/run/shardfeed
{{- end -}}

{{- define "shardfeed-sidecar.cacheDir" -}}
/var/cache/shardfeed
{{- end -}}

{{/* The pool token's Secret, which a pool requires. */}}
{{- define "shardfeed-sidecar.poolTokenSecret" -}}
{{- required "shardfeed.pool.tokenSecret is not set: name the Secret holding the decode pool's token (the shardfeed chart's pool.enabled sets it)" .pool.tokenSecret -}}
{{- end -}}

{{/* Where the pool's TLS files are mounted (sidecar and workers alike). */}}
{{- define "shardfeed-sidecar.poolTlsDir" -}}
/var/run/shardfeed-pool-tls
{{- end -}}

{{/* Where the pool's token is mounted (sidecar and workers alike). */}}
{{- define "shardfeed-sidecar.poolTokenDir" -}}
/var/run/shardfeed-pool
{{- end -}}

{{- define "shardfeed-sidecar.image" -}}
{{- $repository := required "shardfeed.image.repository is not set: give the registry path of your shardfeed image (docker/Dockerfile builds it), e.g. --set shardfeed.image.repository=registry.example.com/infra/shardfeed" .image.repository -}}
{{- printf "%s:%s" $repository (toString .image.tag) -}}
{{- end -}}

{{/* The decoded-source tier's directory, in the cache's volume. */}}
{{- define "shardfeed-sidecar.decodedDir" -}}
/var/cache/shardfeed/decoded
{{- end -}}

{{/* Whether the decoded-source tier is on (it lives in the cache's volume). */}}
{{- define "shardfeed-sidecar.decodedEnabled" -}}
{{- if .cache.decoded.enabled -}}
{{- if not .cache.enabled -}}
{{- fail "shardfeed.cache.decoded.enabled needs shardfeed.cache.enabled: the tier lives in the cache's volume" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* GiB of an emptyDir or ephemeral cache volume: --cache-size (and
--decoded-cache-size when the tier is on) plus headroom. */}}
{{- define "shardfeed-sidecar.cacheLimitGi" -}}
{{- $size := int .cache.sizeGi -}}
{{- if include "shardfeed-sidecar.decodedEnabled" . -}}
{{- $size = add $size (int .cache.decoded.sizeGi) -}}
{{- end -}}
{{- add $size (div (add (mul $size (int .cache.headroomPercent)) 99) 100) -}}
{{- end -}}

{{/* Whether the cache outlives the pod (a node directory or a claim). */}}
{{- define "shardfeed-sidecar.cacheOutlivesPod" -}}
{{- if and .cache.enabled (has .cache.volume (list "hostPath" "persistentVolumeClaim")) -}}true{{- end -}}
{{- end -}}

{{/* The pod's terminationGracePeriodSeconds: the drain, plus time to exit. */}}
{{- define "shardfeed-sidecar.terminationGracePeriodSeconds" -}}
{{- add (int .shutdownGraceSeconds) 10 -}}
{{- end -}}

{{/*
The pod's init containers: the sidecar (an init container that keeps
running, Kubernetes >= 1.29), after the one that prepares a hostPath cache.
*/}}
{{- define "shardfeed-sidecar.initContainers" -}}
{{- include "shardfeed-sidecar.initContainerList" . | trim -}}
{{- end -}}

{{- define "shardfeed-sidecar.initContainerList" -}}
{{- if and .cache.enabled (eq .cache.volume "hostPath") .cache.prepareHostPath }}
# Gives the node's cache directory to the sidecar's user: hostPath
# directories are the kubelet's (root), and fsGroup does not apply to them.
- name: shardfeed-cache-owner
  image: {{ include "shardfeed-sidecar.image" . | quote }}
  imagePullPolicy: {{ .image.pullPolicy }}
  args:
    - prepare-cache-dir
    - --owner
    - "{{ int .securityContext.runAsUser }}:{{ int .securityContext.runAsGroup }}"
    - {{ include "shardfeed-sidecar.cacheDir" . }}
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
      add: ["CHOWN"]
    seccompProfile:
      type: RuntimeDefault
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 64Mi
  volumeMounts:
    - name: shardfeed-cache
      mountPath: {{ include "shardfeed-sidecar.cacheDir" . }}
{{- end }}
- name: shardfeed
  image: {{ include "shardfeed-sidecar.image" . | quote }}
  imagePullPolicy: {{ .image.pullPolicy }}
  restartPolicy: Always
  args: ["serve"]
  env:
    - name: SHARDFEED_LISTEN
      value: unix:{{ include "shardfeed-sidecar.socketDir" . }}/shardfeed.sock
    # Loopback unless a PodMonitor scrapes the pod (scrapeMetrics): metrics
    # name mixed streams' datasets. Scraped: all addresses, as a pod has only
    # loopback and its own (its IP would need brackets when IPv6).
    - name: SHARDFEED_METRICS_LISTEN
      value: "{{ if .scrapeMetrics }}0.0.0.0{{ else }}127.0.0.1{{ end }}:{{ .metricsPort | int64 }}"
    - name: SHARDFEED_MAX_STREAMS
      value: {{ .maxStreams | int64 | quote }}
    - name: SHARDFEED_PART_SIZE
      value: {{ .partSize | int64 | quote }}
    - name: SHARDFEED_PARTS_IN_FLIGHT
      value: {{ .partsInFlight | int64 | quote }}
    - name: SHARDFEED_SHUTDOWN_GRACE
      value: {{ .shutdownGraceSeconds | int64 | quote }}
    # The container's own limit, in bytes, from the Downward API: the budget
    # then never depends on how the node lays out its cgroups.
    - name: SHARDFEED_MEMORY_LIMIT
      valueFrom:
        resourceFieldRef:
          containerName: shardfeed
          resource: limits.memory
    # Decode threads follow the CPU limit (the cgroup's quota) or, where
    # only a request is set, this: the node's other cores are the trainer's.
    - name: SHARDFEED_CPU_REQUEST_MILLICORES
      valueFrom:
        resourceFieldRef:
          containerName: shardfeed
          resource: requests.cpu
          divisor: 1m
    - name: SHARDFEED_LOG_FORMAT
      value: {{ .logFormat | quote }}
    - name: SHARDFEED_LOG
      value: {{ .logLevel | quote }}
    {{- with .allow }}
    - name: SHARDFEED_ALLOW
      value: {{ join "," . | quote }}
    {{- end }}
    {{- with .decodeThreads }}
    - name: SHARDFEED_DECODE_THREADS
      value: {{ . | quote }}
    {{- end }}
    {{- /* Refuses a tier without the cache's volume, whatever else is set. */}}
    {{- $_ := include "shardfeed-sidecar.decodedEnabled" . }}
    {{- if .cache.enabled }}
    - name: SHARDFEED_CACHE_DIR
      value: {{ include "shardfeed-sidecar.cacheDir" . }}
    - name: SHARDFEED_CACHE_SIZE
      value: "{{ int .cache.sizeGi }}Gi"
    {{- if include "shardfeed-sidecar.cacheOutlivesPod" . }}
    - name: SHARDFEED_CACHE_SLOTS
      value: {{ .cache.slots | int64 | quote }}
    - name: SHARDFEED_CACHE_LOCK_WAIT
      value: {{ .cache.lockWaitSeconds | int64 | quote }}
    {{- end }}
    {{- if include "shardfeed-sidecar.decodedEnabled" . }}
    - name: SHARDFEED_DECODED_CACHE_DIR
      value: {{ include "shardfeed-sidecar.decodedDir" . }}
    - name: SHARDFEED_DECODED_CACHE_SIZE
      value: "{{ int .cache.decoded.sizeGi }}Gi"
    {{- end }}
    {{- end }}
    {{- with .s3.region }}
    - name: AWS_REGION
      value: {{ . | quote }}
    {{- end }}
    {{- with .s3.endpoint }}
    - name: SHARDFEED_S3_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    {{- if .s3.forcePathStyle }}
    - name: SHARDFEED_S3_FORCE_PATH_STYLE
      value: "true"
    {{- end }}
    {{- if .pool.address }}
    {{- /* The token is checked first: a pool without it is refused. */}}
    {{- $_ := include "shardfeed-sidecar.poolTokenSecret" . }}
    - name: SHARDFEED_POOL
      value: {{ .pool.address | quote }}
    - name: SHARDFEED_POOL_TOKEN_FILE
      value: {{ include "shardfeed-sidecar.poolTokenDir" . }}/token
    - name: SHARDFEED_POOL_SHARE
      value: {{ .pool.share | quote }}
    {{- if .pool.tlsSecret }}
    - name: SHARDFEED_POOL_TLS_CA
      value: {{ include "shardfeed-sidecar.poolTlsDir" . }}/ca.crt
    - name: SHARDFEED_POOL_TLS_CERT
      value: {{ include "shardfeed-sidecar.poolTlsDir" . }}/tls.crt
    - name: SHARDFEED_POOL_TLS_KEY
      value: {{ include "shardfeed-sidecar.poolTlsDir" . }}/tls.key
    {{- with .pool.tlsServerName }}
    - name: SHARDFEED_POOL_TLS_SERVER_NAME
      value: {{ . | quote }}
    {{- end }}
    {{- else if .pool.insecurePlaintext }}
    - name: SHARDFEED_POOL_INSECURE_PLAINTEXT
      value: "true"
    {{- else }}
    {{- fail "shardfeed.pool.tlsSecret is not set: name the Secret holding the pool's ca.crt, tls.crt and tls.key (the shardfeed chart's pool.tls sets it), or set shardfeed.pool.insecurePlaintext to send units unencrypted" }}
    {{- end }}
    {{- end }}
    {{- with .extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if .scrapeMetrics }}
  ports:
    - name: metrics
      containerPort: {{ .metricsPort | int64 }}
      protocol: TCP
  {{- end }}
  # gRPC health over the Unix socket: the trainer starts once this passes.
  startupProbe:
    exec:
      command: ["/usr/local/bin/shardfeed", "health"]
    periodSeconds: {{ .probes.startup.periodSeconds }}
    failureThreshold: {{ .probes.startup.failureThreshold }}
  # NOT_SERVING while draining. No liveness probe: a restart mid-epoch ends
  # every rank's stream, and a stuck S3 read already ends with a status.
  readinessProbe:
    exec:
      command: ["/usr/local/bin/shardfeed", "health"]
    periodSeconds: {{ .probes.readiness.periodSeconds }}
    failureThreshold: {{ .probes.readiness.failureThreshold }}
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  volumeMounts:
    - name: shardfeed-socket
      mountPath: {{ include "shardfeed-sidecar.socketDir" . }}
    {{- if .cache.enabled }}
    - name: shardfeed-cache
      mountPath: {{ include "shardfeed-sidecar.cacheDir" . }}
    {{- end }}
    {{- if .pool.address }}
    - name: shardfeed-pool-token
      mountPath: {{ include "shardfeed-sidecar.poolTokenDir" . }}
      readOnly: true
    {{- if .pool.tlsSecret }}
    - name: shardfeed-pool-tls
      mountPath: {{ include "shardfeed-sidecar.poolTlsDir" . }}
      readOnly: true
    {{- end }}
    {{- end }}
{{- end -}}

{{/* The trainer container's env: where the sidecar listens. */}}
{{- define "shardfeed-sidecar.trainerEnv" -}}
- name: SHARDFEED_TARGET
  value: unix://{{ include "shardfeed-sidecar.socketDir" . }}/shardfeed.sock
{{- end -}}

{{/* The trainer container's mount of the socket directory. */}}
{{- define "shardfeed-sidecar.trainerVolumeMounts" -}}
- name: shardfeed-socket
  mountPath: {{ include "shardfeed-sidecar.socketDir" . }}
{{- end -}}

{{/*
The pod's volumes for the sidecar. The socket is 0660: the pod needs an
fsGroup (any) unless the trainer runs as root.
*/}}
{{- define "shardfeed-sidecar.volumes" -}}
- name: shardfeed-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- if .pool.address }}
- name: shardfeed-pool-token
  secret:
    secretName: {{ include "shardfeed-sidecar.poolTokenSecret" . | quote }}
    items:
      - key: {{ .pool.tokenKey | quote }}
        path: token
{{- if .pool.tlsSecret }}
- name: shardfeed-pool-tls
  secret:
    secretName: {{ .pool.tlsSecret | quote }}
    items:
      - key: ca.crt
        path: ca.crt
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}
{{- if .cache.enabled }}
{{- if eq .cache.volume "emptyDir" }}
- name: shardfeed-cache
  emptyDir:
    sizeLimit: "{{ include "shardfeed-sidecar.cacheLimitGi" . }}Gi"
{{- else if eq .cache.volume "ephemeral" }}
- name: shardfeed-cache
  ephemeral:
    volumeClaimTemplate:
      spec:
        accessModes: ["ReadWriteOnce"]
        {{- with .cache.storageClassName }}
        storageClassName: {{ . | quote }}
        {{- end }}
        resources:
          requests:
            storage: "{{ include "shardfeed-sidecar.cacheLimitGi" . }}Gi"
{{- else if eq .cache.volume "hostPath" }}
- name: shardfeed-cache
  hostPath:
    path: {{ .cache.hostPath | quote }}
    type: DirectoryOrCreate
{{- else if eq .cache.volume "persistentVolumeClaim" }}
- name: shardfeed-cache
  persistentVolumeClaim:
    claimName: {{ required "shardfeed.cache.claimName is not set: name the claim of the cache's volume (cache.volume: persistentVolumeClaim)" .cache.claimName | quote }}
{{- else }}
{{- fail (printf "shardfeed.cache.volume must be emptyDir, ephemeral, hostPath or persistentVolumeClaim, not %q" .cache.volume) }}
{{- end }}
{{- end }}
{{- end -}}
