# The command lines the module runs. Builtins only (tests/nix evaluates this without nixpkgs).
let
  hostDefaults = import ./host-defaults.nix;
  optional = cond: xs: if cond then xs else [ ];
  flag = name: on: if on then "--${name}" else "--no-${name}";

  # systemd splits ExecStart= itself (no shell): quote anything that is not a plain word,
  # and escape its specifiers (%) and variable references ($) so values reach argv verbatim.
  plain = s: builtins.match "[A-Za-z0-9_./:,=@+-]+" s != null;
  escapeSystemdArg = s:
    if plain s then s
    else "\"" + builtins.replaceStrings [ "\\" "\"" "%" "$" ] [ "\\\\" "\\\"" "%%" "$$" ] s + "\"";
  escapeSystemdArgs = xs: builtins.concatStringsSep " " (map escapeSystemdArg xs);

  # Where the service's own health probe connects: a wildcard listen address is reachable on
  # loopback; IPv6 literals need brackets in a URL.
  probeHost = host:
    if host == "0.0.0.0" || host == "" then "127.0.0.1"
    else if host == "::" then "[::1]"
    else if builtins.match ".*:.*" host != null then "[${host}]"
    else host;
in
rec {
  inherit escapeSystemdArg escapeSystemdArgs;

  # cfg -> the `tt-serve serve` argv. Every setting is passed explicitly, so the unit alone says
  # how the server runs (CLI defaults never leak into a deployment).
  serveArgv = cfg:
    [
      "--host" cfg.host
      "--port" (toString cfg.port)
      "--backend" cfg.backend
      "--device" cfg.device
      "--device-ids" (builtins.concatStringsSep "," (map toString cfg.deviceIds))
      "--mesh" cfg.mesh
      "--dtype" cfg.dtype
      "--precision" cfg.precision
      (flag "device-argmax" cfg.deviceArgmax)
      (flag "device-sampling" cfg.deviceSampling)
      "--gpu-memory-utilization" (toString cfg.gpuMemoryUtilization)
      "--prefill-chunk" (toString cfg.prefillChunk)
      "--block-size" (toString cfg.blockSize)
      "--kv-blocks" (toString cfg.kvBlocks)
      (flag "prefix-caching" cfg.prefixCaching.enable)
      "--snapshot-slots" (toString cfg.prefixCaching.snapshotSlots)
      "--resume-points" cfg.resumePoints
      "--snapshots-per-conversation" (toString cfg.snapshotsPerConversation)
      "--host-cache-gb" (toString cfg.hostCacheGb)
      "--disk-cache-gb" (toString cfg.diskCacheGb)
      "--disk-writeback" cfg.diskWriteback
      "--disk-write-mb-per-s" (toString cfg.diskWriteMbPerS)
      "--disk-read-ahead-mb" (toString cfg.diskReadAheadMb)
      "--response-store-entries" (toString cfg.responseStoreEntries)
      "--response-store-mb" (toString cfg.responseStoreMb)
      "--max-batch-size" (toString cfg.maxBatchSize)
      "--max-waiting" (toString cfg.maxWaiting)
      "--max-num-batched-tokens" (toString cfg.maxNumBatchedTokens)
      "--max-prefill-rows" (toString cfg.maxPrefillRows)
      "--step-probe-seconds" (toString cfg.stepProbeSeconds)
      "--max-model-len" (toString cfg.maxModelLen)
      "--trace-region-size" (toString cfg.traceRegionSize)
      "--log-level" cfg.logLevel
      "--drain-timeout" (toString cfg.drainTimeout)
    ]
    # null (auto) passes no flag: the server resolves it (on for torch on CUDA)
    ++ optional (cfg.deviceResident != null) [ (flag "device-resident" cfg.deviceResident) ]
    ++ optional (cfg.tracedPrefill != null) [ (flag "traced-prefill" cfg.tracedPrefill) ]
    ++ optional (cfg.model != null) [ "--model" cfg.model ]
    ++ optional (cfg.servedModelName != null) [ "--served-model-name" cfg.servedModelName ]
    ++ optional (cfg.diskCacheDir != null) [ "--disk-cache-dir" cfg.diskCacheDir ]

    ++ optional (cfg.apiKeyFile != null) [ "--api-key-file" cfg.apiKeyFile ];

  # The API key reaches the service as a systemd credential (LoadCredential=api-key:<file>),
  # so the DynamicUser can read it; %d is the credentials directory, hence left unescaped.
  execStart = exe: cfg:
    escapeSystemdArgs ([ exe "serve" ] ++ serveArgv (cfg // { apiKeyFile = null; }))
    + (if cfg.apiKeyFile != null then " --api-key-file %d/api-key" else "")
    + (if (cfg.extraArgs or [ ]) != [ ] then " " + escapeSystemdArgs cfg.extraArgs else "");

  # `tt-serve doctor` for the unit's backend and devices (ExecStartPre=): a host that cannot
  # serve fails the start with the doctor's message instead of a stack trace.
  doctorArgv = cfg:
    [ "doctor" "--backend" cfg.backend "--device" cfg.device ]
    ++ optional (cfg.backend == "ttnn")
      [ "--device-ids" (builtins.concatStringsSep "," (map toString cfg.deviceIds)) ];

  doctorExec = exe: cfg: escapeSystemdArgs ([ exe ] ++ doctorArgv cfg);

  startTimeoutMinutes = cfg: cfg.startTimeoutMinutes or hostDefaults.startTimeoutMinutes;

  # systemd's stop bound: the drain (requests in flight finish, new ones get 503), then uvicorn's
  # 5 s close of what is left and the engine's shutdown, with room to spare.
  stopMarginSeconds = 20;
  timeoutStopSec = cfg: "${toString (cfg.drainTimeout + stopMarginSeconds)}s";

  # -- replicas behind a router (cfg.instances non-empty) ----------------------------------

  # Worker i: the same settings on loopback at workerBasePort + i, with its own device group
  # (on CUDA the group's device is cuda:<id>; on the CPU the group only names the replica).
  workerSettings = cfg:
    let
      cuda = cfg.backend == "torch" && builtins.match "cuda(:[0-9]+)?" cfg.device != null;
    in
    builtins.genList
      (i:
        let group = builtins.elemAt cfg.instances i; in
        cfg // {
          host = "127.0.0.1";
          port = cfg.workerBasePort + i;
          deviceIds = group;
          device = if cuda then "cuda:${toString (builtins.head group)}" else cfg.device;
        })
      (builtins.length cfg.instances);

  workerUrls = cfg: map (w: "http://127.0.0.1:${toString w.port}") (workerSettings cfg);

  # The router's view of a worker (its flags below; lib/rollout.nix waits on them). circuitOpenSecs
  # is sglang-router's own default (--cb-timeout-duration-secs, not passed): how long a worker
  # whose circuit opened (e.g. while it restarted) gets no traffic.
  routerHealth = {
    intervalSecs = 5;
    failureThreshold = 3;
    successThreshold = 2;
    timeoutSecs = 5;
    circuitOpenSecs = 60;
  };

  # sglang-router 0.3.2 (`smg launch`, docs/routing.md): listens where a single server would,
  # metrics on loopback only, health every 5 s (a draining worker's 503 takes it out of
  # rotation within ~15 s; retries cover that window) and the circuit opened after 2 failures
  # (with the default 10, a killed sticky worker cost failed requests; measured).
  routerArgv = cfg:
    let h = routerHealth; in
    [ "launch" "--host" cfg.host "--port" (toString cfg.port) "--worker-urls" ]
    ++ workerUrls cfg
    ++ [
      "--policy" cfg.routerPolicy
      "--prometheus-host" "127.0.0.1" "--prometheus-port" (toString cfg.routerPrometheusPort)
      "--health-check-endpoint" "/health" "--health-check-interval-secs" (toString h.intervalSecs)
      "--health-failure-threshold" (toString h.failureThreshold)
      "--health-success-threshold" (toString h.successThreshold)
      "--health-check-timeout-secs" (toString h.timeoutSecs)
      "--cb-failure-threshold" "2" "--retry-max-retries" "5"
      "--request-timeout-secs" "1800"
    ];

  routerExec = exe: cfg:
    escapeSystemdArgs ([ exe ] ++ routerArgv cfg ++ (cfg.routerExtraArgs or [ ]));

  healthUrl = cfg: "http://${probeHost cfg.host}:${toString cfg.port}/health";

  # Readiness: ExecStartPost= polls /health, so the unit is "started" only once the model is
  # loaded (and, on ttnn, firmware and kernels compiled, traces captured). TimeoutStartSec= bounds
  # the whole wait; one retry every 2 s for that long keeps curl polling until systemd gives up.
  healthProbe = curl: cfg:
    escapeSystemdArgs [
      "${curl}/bin/curl" "--silent" "--show-error" "--fail" "--output" "/dev/null"
      "--max-time" "5" "--retry" (toString (startTimeoutMinutes cfg * 30)) "--retry-delay" "2"
      "--retry-connrefused" "--retry-all-errors" (healthUrl cfg)
    ];
}
