# NixOS module: services.tenstorrent-serving runs `tt-serve serve` as a hardened systemd service.
#
# This file only declares options and wires in the builtins-only files under ./lib:
#   lib/defaults.nix    option defaults (mirrored by tt_serve/config/serve_config.py)
#   lib/invariants.nix  the assertions (the same rules as tt_serve.config.validate)
#   lib/args.nix        ExecStart=, the pre-start doctor and the /health readiness probe
#   lib/host-defaults.nix  defaults of the module-only options (hugepages, kernelDriver, ...)
#   lib/runtime.nix     what the Tenstorrent runtime reads and writes (env, directories)
#   lib/rollout.nix     rolling restarts of the workers on `nixos-rebuild switch`
# It uses only mkOption, mkEnableOption, mkIf, optionalAttrs, optionals, literalExpression and
# plain types, which is the subset the offline test stand-in (tests/nix/stub-nixpkgs) provides.
{ config, lib, pkgs, ... }:
let
  inherit (lib) mkOption mkEnableOption mkIf optionalAttrs optionals types;
  cfg = config.services.tenstorrent-serving;
  d = import ./lib/defaults.nix;
  hd = import ./lib/host-defaults.nix;
  args = import ./lib/args.nix;
  rt = import ./lib/runtime.nix;
  rollout = import ./lib/rollout.nix;
  p = "services.tenstorrent-serving";

  ttnn = cfg.backend == "ttnn";
  cuda = cfg.backend == "torch" && builtins.match "cuda(:[0-9]+)?" cfg.device != null;
  hugepages = ttnn && cfg.hugepages.enable;
  hugepageDir = rt.hugepageDir;
  kmd = ttnn && cfg.kernelDriver.enable;
  # Built for the host's own kernel; forced only when the driver is wanted.
  kmdPackage = config.boot.kernelPackages.callPackage ../nix/tt-kmd.nix { };

  opt = type: default: description: mkOption { inherit type default description; };

  hardening = {
    DynamicUser = true;
    UMask = "0077";
    ProtectSystem = "strict";
    ProtectHome = true;
    PrivateTmp = true;
    NoNewPrivileges = true;
    CapabilityBoundingSet = "";
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectClock = true;
    ProtectHostname = true;
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" ];
    SystemCallArchitectures = "native";
  };

  # One `tt-serve serve` unit: the single server, or worker i of cfg.instances (w is cfg with
  # that worker's host, port and devices; lib/args.nix workerSettings).
  serverUnit = unit: w: {
    description = "tt-serve LLM server" + (if unit == rt.name then "" else " (${unit})");
    wantedBy = [ "multi-user.target" ];
    after = [ "network.target" ];
    # The demo model and the ttnn kernel cache live in the service's own cache/state dirs,
    # named explicitly (lib/runtime.nix), never left to $HOME guessing.
    environment = rt.environment {
      inherit ttnn unit;
      runtimeRoot = cfg.package.ttnnRuntimeRoot or null;
    } // cfg.environment;
    # The torch backend on a CPU compiles its C kernels (tt_serve/model/kernels/native.c) at the
    # first start with the machine's own compiler, -march=native, into the cache directory
    # (XDG_CACHE_HOME); without one in PATH it logs that and runs the slower torch ops.
    path = optionals (!ttnn && !cuda) [ pkgs.stdenv.cc pkgs.binutils ];
    unitConfig = optionalAttrs hugepages { RequiresMountsFor = hugepageDir; };
    serviceConfig = hardening // {
      Type = "exec";
      ExecStartPre = optionals cfg.preStartCheck [
        (args.doctorExec "${cfg.package}/bin/tt-serve" w)
      ];
      ExecStart = args.execStart "${cfg.package}/bin/tt-serve" w;
      ExecStartPost = args.healthProbe pkgs.curl w;
      # Loading weights, compiling kernels (first start) and capturing traces take minutes.
      TimeoutStartSec = "${toString (args.startTimeoutMinutes cfg)}min";
      # SIGTERM drains (lib/args.nix: drainTimeout plus a margin for the shutdown).
      TimeoutStopSec = args.timeoutStopSec cfg;
      Restart = "on-failure";
      RestartSec = "10s";

      StateDirectory = unit;
      CacheDirectory = unit;
      LogsDirectory = unit;
      WorkingDirectory = (rt.dirsFor unit).stateDir;
      # torch (oneDNN) JIT-compiles CPU kernels into writable+executable memory.
      MemoryDenyWriteExecute = false;
      # Accelerators need their device nodes; on CPU the service sees no devices at all.
      PrivateDevices = !(ttnn || cuda);
      DevicePolicy = "closed";
      DeviceAllow =
        optionals ttnn [ "char-tenstorrent rw" ]
        ++ optionals cuda [ "char-nvidia-frontend rw" "char-nvidia-uvm rw" ];
    }
    // optionalAttrs ttnn {
      SupplementaryGroups = [ "tenstorrent" ];
      # Host buffers are pinned for device DMA by tt-kmd (pin_user_pages, not charged to
      # RLIMIT_MEMLOCK in 2.10.0) and UMD calls no mlock; unlimited keeps any other pinning
      # path (e.g. a newer driver that charges it) from failing at run time.
      LimitMEMLOCK = "infinity";
    }
    // optionalAttrs (hugepages || cfg.diskCacheDir != null) {
      # The disk tier's folder lives outside the unit's own directories when it is set.
      ReadWritePaths = optionals hugepages [ hugepageDir ]
        ++ optionals (cfg.diskCacheDir != null) [ cfg.diskCacheDir ];
    }
    // optionalAttrs (cfg.apiKeyFile != null) {
      LoadCredential = [ "api-key:${cfg.apiKeyFile}" ];
    };
  };

  workers = args.workerSettings cfg;
  workerUnit = i: "${rt.name}-worker-${toString i}";
  workerIndices = builtins.genList (i: i) (builtins.length workers);

  # With rolling restarts a switch leaves the workers running (restartIfChanged = false) and
  # the rollout unit restarts them one at a time (lib/rollout.nix says what of NixOS it relies on).
  rolling = cfg.instances != [ ] && cfg.rollingRestart.enable;
  workerDef = i:
    serverUnit (workerUnit i) (builtins.elemAt workers i)
    // optionalAttrs rolling { restartIfChanged = false; };

  rolloutUnit = {
    description = "tt-serve rolling restart of the workers, one at a time";
    wantedBy = [ "multi-user.target" ];
    # One trigger per worker: its definition as written here (ExecStart=, environment, limits),
    # so a change to any worker changes this unit and the switch restarts it.
    restartTriggers =
      map (i: builtins.hashString "sha256" (builtins.toJSON (workerDef i))) workerIndices;
    stopIfChanged = false;
    path = [ pkgs.curl ];
    script = rollout.script (map
      (i: { name = workerUnit i; healthUrl = args.healthUrl (builtins.elemAt workers i); })
      workerIndices);
    serviceConfig = {
      Type = "oneshot";
      RemainAfterExit = true;
      TimeoutStartSec = rollout.timeoutStartSec cfg workers;
    };
  };

  # The router listens where the single server would (host:port); it registers workers as
  # their /health turns 200, so it does not wait for them to start.
  routerUnit = {
    description = "tt-serve router (sglang-router, ${cfg.routerPolicy})";
    wantedBy = [ "multi-user.target" ];
    after = [ "network.target" ];
    wants = builtins.genList workerUnit (builtins.length workers);
    serviceConfig = hardening // {
      Type = "exec";
      ExecStart = args.routerExec "${cfg.routerPackage}/bin/smg" cfg;
      Restart = "on-failure";
      RestartSec = "5s";
      PrivateDevices = true;
      DevicePolicy = "closed";
      MemoryDenyWriteExecute = true;
    };
  };
in
{
  options.services.tenstorrent-serving = {
    enable = mkEnableOption "the tt-serve OpenAI-compatible LLM server (Tenstorrent first)";

    package = mkOption {
      type = types.package;
      default = pkgs.tt-serve;
      defaultText = lib.literalExpression "pkgs.tt-serve";
      description = "The tt-serve package (the flake's overlay provides pkgs.tt-serve).";
    };

    model = opt (types.nullOr types.str) d.model ''
      Absolute path of a Hugging Face checkpoint directory (config.json, *.safetensors,
      tokenizer.json). A string, not a Nix path, so the weights are never copied into the
      store. null serves the built-in demo model.
    '';
    servedModelName = opt (types.nullOr types.str) d.servedModelName
      "Model name reported by /v1/models (null: the directory name).";
    host = opt types.str d.host "Address to listen on.";
    port = opt types.port d.port "TCP port to listen on.";
    openFirewall = opt types.bool false "Open port in the firewall.";

    backend = opt (types.enum [ "torch" "ttnn" ]) d.backend
      "torch: CPU/CUDA reference backend; ttnn: Tenstorrent devices.";
    device = opt types.str d.device "torch backend device: cpu, cuda or cuda:N.";
    deviceIds = opt (types.listOf types.int) d.deviceIds "Tenstorrent device ids (ttnn), opened as one mesh.";
    mesh = opt types.str d.mesh ''
      ttnn: the mesh shape "ROWSxCOLS" the deviceIds form, in row-major order ("1x2" on N300,
      "1x4" on 4xP150, "1x8" or "2x4" on T3K, "8x4" on Galaxy; on a 2-D mesh the heads split
      over the columns and every projection also over the rows; MoE models run on 1xN meshes
      only); "": 1 x the number of deviceIds.
    '';
    dtype = opt (types.enum [ "auto" "float32" "bfloat16" ]) d.dtype ''
      Compute dtype: auto = float32 for torch on the CPU, bfloat16 elsewhere. float32 is
      refused on backend = "ttnn" (use precision for its weights).
    '';
    precision = opt (types.enum [ "auto" "bfloat16" "mixed" "bfp4-mlp" ]) d.precision ''
      Weight precision profile, the same on both backends: bfloat16 (every weight bf16),
      mixed (attention, GDN, MLP, expert and LM-head weights bfloat8_b), bfp4-mlp (as mixed,
      MLP and expert weights bfloat4_b); auto: bfloat16 on ttnn, the checkpoint's float32 on
      torch (a profile on torch runs the CPU's block-float kernels). On torch it needs device
      cpu and dtype float32; MoE routed experts stay float32 there.
    '';
    deviceArgmax = opt types.bool d.deviceArgmax
      "Pick greedy tokens on the device; only token ids come back to the host.";
    deviceSampling = opt types.bool d.deviceSampling ''
      Draw temperature / top-k / top-p / min-p tokens on the device from host-drawn uniforms
      (the host sampler's exact rules); only ids come back. Off: every non-greedy row's logits
      come to the host (the A/B control arm). With deviceArgmax off every token is picked on
      the host, so this has no effect then.
    '';
    deviceResident = opt (types.nullOr types.bool) d.deviceResident ''
      Keep the decode loop's token buffer on the device. Requires deviceArgmax.
      null (auto): on for backend torch on a CUDA device (with deviceArgmax), off elsewhere.
    '';
    tracedPrefill = opt (types.nullOr types.bool) d.tracedPrefill ''
      Replay captured prefill traces (ttnn) or CUDA graphs (torch on CUDA).
      null (auto): on for backend torch on a CUDA device, off elsewhere.
    '';
    gpuMemoryUtilization = opt (types.either types.float types.int) d.gpuMemoryUtilization ''
      Backend torch on CUDA: the fraction of the GPU's memory the server may hold (weights,
      graphs, activations and the KV pool, which takes what the rest leaves); kvBlocks
      overrides the pool's size.
    '';
    prefillChunk = opt types.int d.prefillChunk
      "Prefill chunk length in tokens; also a prefix-cache resume point every prefillChunk tokens.";
    blockSize = opt types.int d.blockSize "KV cache block (page) size in tokens.";
    kvBlocks = opt types.int d.kvBlocks
      "Number of KV blocks: 0 sizes the pool from free memory, otherwise at least 2.";
    prefixCaching = {
      enable = opt types.bool d.prefixCaching.enable
        "Joint prefix cache (KV pages + GDN state snapshots).";
      snapshotSlots = opt types.int d.prefixCaching.snapshotSlots
        "Number of GDN state snapshot slots.";
    };
    resumePoints = opt (types.enum [ "messages" "chunks" ]) d.resumePoints ''
      Where prompts are cut and prefix-cache hits resume: messages (the start of every chat
      message, the prompt end and every prefillChunk multiple, so an agent's next turn resumes
      at its previous answer) or chunks (prefillChunk multiples only: the A/B control).
    '';
    snapshotsPerConversation = opt types.int d.snapshotsPerConversation
      "Most GDN snapshots on one conversation's path; past it the least valuable is evicted (0: no cap).";
    hostCacheGb = opt types.number d.hostCacheGb ''
      GiB of host memory for the prefix cache's host tier (0: off). Every published GDN
      snapshot is written through with the KV of its prefix as one unit per resume point; a
      conversation the device pool lost is restored from here, bit for bit, instead of being
      recomputed. One budget, evicted by value (tokens a unit spares x its uses); the tier
      never holds KV without its snapshot.
    '';
    diskCacheDir = opt (types.nullOr types.str) d.diskCacheDir ''
      Folder of the disk tier (null: off): the same units as checksummed files, written
      atomically in the background, in a subfolder named by the checkpoint, backend, dtype and
      precision, so a restarted server (or a replica sharing the folder) finds its
      conversations warm and a changed checkpoint never restores an old state. A torn or
      corrupted file is a miss and is removed. An unusable folder fails the start; a full disk
      at run time turns the tier off (logged, counted in the metrics). The folder must exist
      and be writable by the service (it is added to ReadWritePaths=); replica workers run as
      separate dynamic users, so give each its own folder unless they share a group.
    '';
    diskCacheGb = opt types.number d.diskCacheGb
      "GiB the disk tier may hold (past it, the units of least value are removed, as in the host tier).";
    diskWriteback = opt (types.enum [ "resume" "all" ]) d.diskWriteback ''
      Which units the disk tier takes: resume writes each request's first and last message
      cuts (the shared head, and where the conversation's next turn resumes) plus any unit a
      host-tier restore reused; chunk ends and prompt ends in between stay in host memory.
      all writes every unit through (the A/B control; several times the disk bytes per turn).
    '';
    diskWriteMbPerS = opt types.number d.diskWriteMbPerS
      "Average MiB per second the disk write-back may write (0: unpaced); past the write-back queue's bound a unit stays in host memory only.";
    diskReadAheadMb = opt types.int d.diskReadAheadMb ''
      MiB of disk-tier units a reader thread may hold, read or in flight, for requests waiting
      on them: the request waits while the engine steps on (0: the engine step reads the disk
      itself, the A/B control).
    '';
    responseStoreEntries = opt types.int d.responseStoreEntries ''
      Stored responses kept at most (the Responses API's store: previous_response_id continues
      from their exact token ids), the least recently used evicted first; with diskCacheDir
      they are files in its responses/ folder and survive a restart. 0: none are stored.
    '';
    responseStoreMb = opt types.int d.responseStoreMb "MiB the stored responses may hold.";
    maxBatchSize = opt types.int d.maxBatchSize
      "Running requests at once; 0 = the backend's default (32 on torch, 16 on ttnn).";
    maxWaiting = opt types.int d.maxWaiting "Maximum queued requests before 503.";
    maxNumBatchedTokens = opt types.int d.maxNumBatchedTokens "Token budget per engine step.";
    maxPrefillRows = opt types.int d.maxPrefillRows ''
      Requests advancing their prompt in one step, the earliest admitted first (one chunk
      each): agents whose turns arrive together get their first tokens one after another
      instead of all at the end; a long prompt admitted first holds the others' first tokens
      until its prefill ends. 0: the backend's default (ttnn 1: its prefill traces replay one
      row per chunk; torch measures its own steps, 1 where a chunk's compute dwarfs a step's
      fixed cost, as on a CPU at the 0.8B shape, all of them where it does not). At least
      maxBatchSize: every prefilling request, in lockstep.
    '';
    stepProbeSeconds = opt types.number d.stepProbeSeconds ''
      Seconds the startup may spend timing a few scratch steps for maxPrefillRows 0 on torch
      (about 5 s at the 0.8B shape on 2 CPU cores, under 1 s on the demo model), so the first
      burst after a start already gets the measured rows. 0: none (the first burst then runs
      in lockstep until its own steps were timed).
    '';
    maxModelLen = opt types.int d.maxModelLen "Context limit in tokens; 0 = the model's own.";
    traceRegionSize = opt types.int d.traceRegionSize ''
      ttnn trace region in bytes (split over the DRAM banks); 0 sizes it from the traces
      the backend captures (1.5x the estimate, whole 16 MiB). See `tt-serve plan`.
    '';
    apiKeyFile = opt (types.nullOr types.str) d.apiKeyFile ''
      File holding the API key clients must send as a Bearer token. Passed to the service
      as a systemd credential (LoadCredential), so it may be readable by root only; give a
      string path outside the Nix store.
    '';
    logLevel = opt (types.enum [ "critical" "error" "warning" "info" "debug" "trace" ])
      d.logLevel "Server log level.";
    extraArgs = opt (types.listOf types.str) [ ] "Extra arguments appended to `tt-serve serve`.";
    environment = opt (types.attrsOf types.str) { } "Extra environment variables for the service.";

    hugepages = {
      enable = opt types.bool hd.hugepages.enable ''
        With backend = "ttnn": reserve 1 GiB huge pages at boot and mount them at
        ${hugepageDir}, where the Tenstorrent runtime maps its host-device channels.
      '';
      count = opt types.ints.positive hd.hugepages.count
        "Number of 1 GiB huge pages to reserve (at least one per device in deviceIds).";
    };

    kernelDriver.enable = opt types.bool hd.kernelDriver.enable ''
      With backend = "ttnn": build the Tenstorrent kernel driver tt-kmd (pinned release,
      nix/tt-kmd.nix) for boot.kernelPackages, load it and install its udev rules. false: the
      host configuration provides tt-kmd >= ${rt.kmdMinimum} itself (a warning says so).
    '';
    preStartCheck = opt types.bool hd.preStartCheck ''
      Run `tt-serve doctor` for the configured backend before the server (ExecStartPre=), so a
      host that cannot serve (no device nodes, driver, huge pages, SFPI compiler, writable
      kernel cache) fails the start with a message naming what is missing.
    '';
    startTimeoutMinutes = opt types.ints.positive hd.startTimeoutMinutes ''
      How long the unit may take to become ready (/health answering). The first start on
      ttnn compiles the firmware and every kernel with the SFPI compiler into the kernel cache
      (${rt.cacheDir}), which can take many minutes; later starts reuse the cache.
    '';

    drainTimeout = opt types.int d.drainTimeout ''
      Seconds a server drains after SIGTERM: /health and new requests answer 503 (a router
      takes it out of rotation and retries elsewhere) while requests in flight, streams
      included, finish. TimeoutStopSec= is this plus a margin for the shutdown itself.
    '';

    instances = opt (types.listOf (types.listOf types.int)) d.instances ''
      Replicas behind a router: one worker unit per device group (tenstorrent-serving-worker-<i>,
      on 127.0.0.1 at workerBasePort + i, its deviceIds the group; on CUDA the group's device is
      cuda:<id>, on the CPU the group only names the replica), plus tenstorrent-serving-router
      (the pinned sglang-router) listening on host:port. Empty: one server on host:port.
    '';
    workerBasePort = opt types.port d.workerBasePort
      "With instances: worker i listens on 127.0.0.1 at this port + i.";
    routerPolicy = opt (types.enum [ "cache_aware" "round_robin" "power_of_two" "random" ])
      d.routerPolicy ''
      With instances: the router's policy. cache_aware keeps a conversation on the replica
      that holds its prefix (docs/routing.md).
    '';
    routerPrometheusPort = opt types.port d.routerPrometheusPort
      "With instances: the router's Prometheus metrics port (on 127.0.0.1).";
    routerPackage = mkOption {
      type = types.package;
      default = pkgs.sglang-router;
      defaultText = lib.literalExpression "pkgs.sglang-router";
      description = "The router (sglang-router, pinned in nix/pins.json; the overlay provides it).";
    };
    routerExtraArgs = opt (types.listOf types.str) [ ] "Extra arguments appended to `smg launch`.";
    rollingRestart.enable = opt types.bool hd.rollingRestart.enable ''
      With instances: `nixos-rebuild switch` restarts changed workers one at a time, each back
      on /health (and in the router's rotation) before the next drains, so the router always
      has a worker (the unit tenstorrent-serving-rollout; `systemctl restart` it to roll by
      hand). The switch waits for the whole rollout and fails if a worker does not come back;
      the workers after it keep their old definition. false: systemd restarts them together.
    '';
  };

  config = mkIf cfg.enable {
    assertions = import ./lib/invariants.nix cfg;

    networking.firewall.allowedTCPPorts = mkIf cfg.openFirewall [ cfg.port ];

    # /dev/tenstorrent/N come from the tt-kmd driver; let the service's group open them.
    users.groups.tenstorrent = mkIf ttnn { };
    boot.extraModulePackages = mkIf kmd [ kmdPackage ];
    boot.kernelModules = mkIf kmd [ "tenstorrent" ];
    services.udev.packages = mkIf kmd [ kmdPackage ];
    warnings = mkIf (ttnn && !cfg.kernelDriver.enable) [ (rt.kernelDriverWarning p) ];
    services.udev.extraRules = mkIf ttnn ''
      SUBSYSTEM=="tenstorrent", GROUP="tenstorrent", MODE="0660"
    '';

    boot.kernelParams = mkIf hugepages [
      "hugepagesz=1G"
      "hugepages=${toString cfg.hugepages.count}"
    ];
    systemd.mounts = mkIf hugepages [
      {
        description = "1 GiB huge pages for the Tenstorrent runtime";
        what = "hugetlbfs";
        where = hugepageDir;
        type = "hugetlbfs";
        options = "pagesize=1G,mode=1777,nosuid,nodev";
        wantedBy = [ "multi-user.target" ];
      }
    ];

    systemd.services =
      if cfg.instances == [ ] then { ${rt.name} = serverUnit rt.name cfg; }
      else
        builtins.listToAttrs (map (i: { name = workerUnit i; value = workerDef i; }) workerIndices)
        // { "${rt.name}-router" = routerUnit; }
        // optionalAttrs rolling { "${rt.name}-rollout" = rolloutUnit; };
  };
}
