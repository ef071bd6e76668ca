# The configuration rule set, as NixOS assertions: cfg -> [ { assertion; message; } ].
# Builtins only, so the real evaluator runs it without nixpkgs (tests/nix).
# tt_serve/config/rules.py's validate() holds the same rules in the same order with the same
# messages; tests/nix/test_invariants.py requires identical verdicts on one truth table.
cfg:
let
  p = "services.tenstorrent-serving";
  gdnChunk = 64; # tt_serve.config.serve_config.GDN_CHUNK
  ttnnMaxBatch = 32;
  ttnnBlockAlign = 32; # ttnn keeps paged KV in TILE layout (32 x 32)
  backends = [ "torch" "ttnn" ];
  dtypes = [ "auto" "float32" "bfloat16" ];
  precisions = [ "auto" "bfloat16" "mixed" "bfp4-mlp" ];
  resumePoints = [ "messages" "chunks" ];
  diskWritebacks = [ "resume" "all" ];
  logLevels = [ "critical" "error" "warning" "info" "debug" "trace" ];
  routerPolicies = [ "cache_aware" "round_robin" "power_of_two" "random" ];

  # Nix has no modulo; truncating division gives a remainder that is 0 exactly when Python's is.
  rem = a: b: a - (a / b) * b;
  multiple = value: of: of > 0 && rem value of == 0;
  isCuda = d: builtins.match "cuda(:[0-9]+)?" d != null;
  elem = builtins.elem;
  all = builtins.all;
  s = toString;

  ttnn = cfg.backend == "ttnn";
  accelerated = ttnn || (cfg.backend == "torch" && isCuda cfg.device);
  where = "got backend ${cfg.backend}, device ${cfg.device}";
  ids = builtins.concatStringsSep "," (map toString cfg.deviceIds);
  distinct = l: builtins.length (builtins.attrNames (builtins.listToAttrs
    (map (i: { name = toString i; value = true; }) l))) == builtins.length l;
  pc = cfg.prefixCaching;
  meshMatch = if cfg.mesh == "" then null else builtins.match "([1-9][0-9]*)x([1-9][0-9]*)" cfg.mesh;
  meshRows = if meshMatch == null then 0 else builtins.fromJSON (builtins.elemAt meshMatch 0);
  meshCols = if meshMatch == null then 0 else builtins.fromJSON (builtins.elemAt meshMatch 1);
  chips = meshRows * meshCols;
  meshSides = [ 1 2 4 8 ]; # tt_serve.config.rules.MESH_SIDES

  rule = assertion: message: { inherit assertion message; };

  # Replica topology (tt_serve.config.rules._replica_rules).
  n = builtins.length cfg.instances;
  base = cfg.workerBasePort;
  last = base + n - 1;
  q = cfg.routerPrometheusPort;
  groups = builtins.concatStringsSep ";"
    (map (g: builtins.concatStringsSep "," (map toString g)) cfg.instances);
  flat = builtins.concatLists cfg.instances;
  inWorkers = x: x >= base && x <= last;
  workers = "the workers' ports ${s base}..${s last}";
in
[
  (rule (cfg.port >= 1 && cfg.port <= 65535) "${p}.port must be in 1..65535 (got ${s cfg.port}).")
  (rule (elem cfg.backend backends)
    "${p}.backend must be one of torch, ttnn (got ${cfg.backend}).")
  (rule (cfg.device == "cpu" || isCuda cfg.device)
    "${p}.device must be cpu, cuda or cuda:N (got ${cfg.device}).")
  (rule (!ttnn || (cfg.deviceIds != [ ] && all (i: i >= 0) cfg.deviceIds && distinct cfg.deviceIds))
    "${p}.deviceIds must be a non-empty list of distinct non-negative integers on backend ttnn (got \"${ids}\").")
  (rule (cfg.mesh == "" || meshMatch != null)
    "${p}.mesh must be \"ROWSxCOLS\" with positive integers, e.g. \"1x4\" (got \"${cfg.mesh}\").")
  (rule (cfg.mesh == "" || ttnn)
    "${p}.mesh shapes a Tenstorrent mesh; it needs ${p}.backend = \"ttnn\" (got backend ${cfg.backend}).")
  (rule (!ttnn || meshMatch == null || chips == builtins.length cfg.deviceIds)
    "${p}.mesh = \"${cfg.mesh}\" has ${s chips} chips but ${p}.deviceIds names ${s (builtins.length cfg.deviceIds)} (\"${ids}\"): give one device id per chip.")
  (rule (!ttnn || meshMatch == null || (elem meshRows meshSides && elem meshCols meshSides))
    "${p}.mesh = \"${cfg.mesh}\": each side must be 1, 2, 4 or 8 (the shapes tt-metal opens: 1x2, 1x4, 1x8, 2x4, 8x4, 4x8; heads and tile widths split by powers of two).")
  (rule (!ttnn || meshMatch == null || meshRows == 1 || meshCols > 1)
    "${p}.mesh = \"${cfg.mesh}\" puts the chips in one column; tensor parallel splits the heads over the columns: use \"1x${s chips}\".")
  (rule (elem cfg.dtype dtypes)
    "${p}.dtype must be one of auto, float32, bfloat16 (got ${cfg.dtype}).")
  (rule (!ttnn || cfg.dtype != "float32")
    "${p}.dtype = float32 is not available on backend ttnn (it computes in bfloat16 and block floats): use auto or bfloat16, and ${p}.precision for the weights.")
  (rule (elem cfg.precision precisions)
    "${p}.precision must be one of ${builtins.concatStringsSep ", " precisions} (got ${cfg.precision}).")
  (rule (ttnn || cfg.precision == "auto" || (!(isCuda cfg.device) && cfg.dtype != "bfloat16"))
    "${p}.precision = ${cfg.precision} on backend torch holds the card's weight formats for the CPU's float32 kernels: it needs a CPU ${p}.device and ${p}.dtype auto or float32 (got device ${cfg.device}, dtype ${cfg.dtype}).")
  (rule (cfg.deviceResident != true || cfg.deviceArgmax)
    "${p}.deviceResident = true requires ${p}.deviceArgmax = true (the decode loop feeds sampled ids back on the device; logits never leave it).")
  (rule (cfg.deviceResident != true || accelerated)
    "${p}.deviceResident = true needs ${p}.backend = \"ttnn\" or a CUDA ${p}.device (${where}).")
  (rule (cfg.tracedPrefill != true || accelerated)
    "${p}.tracedPrefill = true needs ${p}.backend = \"ttnn\" or a CUDA ${p}.device (${where}).")
  (rule (cfg.gpuMemoryUtilization > 0 && cfg.gpuMemoryUtilization <= 1)
    "${p}.gpuMemoryUtilization must be more than 0 and at most 1 (a fraction of the GPU's memory).")
  (rule (cfg.blockSize > 0) "${p}.blockSize must be positive (got ${s cfg.blockSize}).")
  (rule (!ttnn || rem cfg.blockSize ttnnBlockAlign == 0)
    "${p}.blockSize must be a multiple of ${s ttnnBlockAlign} on backend ttnn (TILE rows; got ${s cfg.blockSize}).")
  (rule (cfg.prefillChunk > 0) "${p}.prefillChunk must be positive (got ${s cfg.prefillChunk}).")
  (rule (!pc.enable || (multiple cfg.prefillChunk cfg.blockSize && rem cfg.prefillChunk gdnChunk == 0))
    "${p}.prefixCaching.enable = true requires ${p}.prefillChunk (${s cfg.prefillChunk}) to be a multiple of ${p}.blockSize (${s cfg.blockSize}) and of the GDN chunk (${s gdnChunk}): snapshots are taken only at chunk boundaries.")
  (rule (!pc.enable || pc.snapshotSlots >= 1)
    "${p}.prefixCaching.enable = true requires ${p}.prefixCaching.snapshotSlots >= 1 (got ${s pc.snapshotSlots}).")
  (rule (elem cfg.resumePoints resumePoints)
    "${p}.resumePoints must be one of ${builtins.concatStringsSep ", " resumePoints} (got ${cfg.resumePoints}).")
  (rule (cfg.snapshotsPerConversation >= 0)
    "${p}.snapshotsPerConversation must not be negative (got ${s cfg.snapshotsPerConversation}).")
  (rule (cfg.hostCacheGb >= 0)
    "${p}.hostCacheGb must not be negative (0 = no host tier; got ${s cfg.hostCacheGb}).")
  (rule (cfg.diskCacheDir == null || cfg.diskCacheGb > 0)
    "${p}.diskCacheGb must be positive when ${p}.diskCacheDir is set (got ${s cfg.diskCacheGb}).")
  (rule (elem cfg.diskWriteback diskWritebacks)
    "${p}.diskWriteback must be one of ${builtins.concatStringsSep ", " diskWritebacks} (got ${cfg.diskWriteback}).")
  (rule (cfg.diskWriteMbPerS >= 0 && cfg.diskReadAheadMb >= 0)
    "${p}.diskWriteMbPerS and ${p}.diskReadAheadMb must not be negative (0: unpaced; 0: reads in the step; got ${s cfg.diskWriteMbPerS} and ${s cfg.diskReadAheadMb}).")
  (rule (pc.snapshotSlots >= 0)
    "${p}.prefixCaching.snapshotSlots must not be negative (got ${s pc.snapshotSlots}).")
  (rule (multiple cfg.prefillChunk cfg.blockSize)
    "${p}.prefillChunk (${s cfg.prefillChunk}) must be a multiple of ${p}.blockSize (${s cfg.blockSize}): prefill chunks end on block boundaries.")
  (if ttnn then
    rule (cfg.maxBatchSize >= 0 && cfg.maxBatchSize <= ttnnMaxBatch)
      "${p}.maxBatchSize must be in 0..${s ttnnMaxBatch} on backend ttnn (0 = the backend's default; got ${s cfg.maxBatchSize})."
  else
    rule (cfg.maxBatchSize >= 0) "${p}.maxBatchSize must not be negative (0 = the backend's default; got ${s cfg.maxBatchSize}).")
  (rule (cfg.maxNumBatchedTokens >= cfg.prefillChunk)
    "${p}.maxNumBatchedTokens (${s cfg.maxNumBatchedTokens}) must be at least ${p}.prefillChunk (${s cfg.prefillChunk}): one step must fit a whole chunk.")
  (rule (cfg.maxWaiting >= 0) "${p}.maxWaiting must not be negative (got ${s cfg.maxWaiting}).")
  (rule (cfg.responseStoreEntries >= 0 && cfg.responseStoreMb >= 0)
    "${p}.responseStoreEntries and ${p}.responseStoreMb must not be negative (got ${s cfg.responseStoreEntries} and ${s cfg.responseStoreMb}).")
  (rule (cfg.maxPrefillRows >= 0)
    "${p}.maxPrefillRows must not be negative (0 = the backend's default; got ${s cfg.maxPrefillRows}).")
  (rule (cfg.stepProbeSeconds >= 0)
    "${p}.stepProbeSeconds must not be negative (0: no startup probe; got ${s cfg.stepProbeSeconds}).")
  (rule (cfg.kvBlocks == 0 || cfg.kvBlocks >= 2)
    "${p}.kvBlocks must be 0 (size from memory) or at least 2 (block 0 is reserved for padding; got ${s cfg.kvBlocks}).")
  (rule (cfg.maxModelLen >= 0)
    "${p}.maxModelLen must not be negative (0 = the model's own; got ${s cfg.maxModelLen}).")
  (rule (cfg.traceRegionSize >= 0)
    "${p}.traceRegionSize must not be negative (0 = sized from the captured traces; got ${s cfg.traceRegionSize}).")
  (rule (elem cfg.logLevel logLevels)
    "${p}.logLevel must be one of ${builtins.concatStringsSep ", " logLevels} (got ${cfg.logLevel}).")
  (rule (cfg.drainTimeout >= 1)
    "${p}.drainTimeout must be at least 1 second (got ${s cfg.drainTimeout}).")
  (rule (elem cfg.routerPolicy routerPolicies)
    "${p}.routerPolicy must be one of ${builtins.concatStringsSep ", " routerPolicies} (got ${cfg.routerPolicy}).")
  (rule (all (g: g != [ ] && all (i: i >= 0) g) cfg.instances)
    "${p}.instances must be non-empty device groups of non-negative integers (got \"${groups}\").")
  (rule (distinct flat) "${p}.instances must not use a device twice (got \"${groups}\").")
  (rule (n == 0 || !accelerated || ttnn || all (g: builtins.length g == 1) cfg.instances)
    "${p}.instances must give each worker one device on a CUDA ${p}.device (${where}; got \"${groups}\").")
  (rule (n == 0 || !ttnn || chips == 0 || all (g: builtins.length g == chips) cfg.instances)
    "${p}.instances must give each worker one device per chip of ${p}.mesh = \"${cfg.mesh}\" (${s chips}) on backend ttnn (got \"${groups}\").")
  (rule (n == 0 || (base >= 1 && last <= 65535))
    "${p}.workerBasePort (${s base}) leaves no room for ${s n} workers: ports ${s base}..${s last} must be in 1..65535.")
  (rule (n == 0 || !(inWorkers cfg.port))
    "${p}.port (${s cfg.port}) is the router's and must not be one of ${workers}.")
  (rule (n == 0 || (q >= 1 && q <= 65535 && q != cfg.port && !(inWorkers q)))
    "${p}.routerPrometheusPort (${s q}) must be in 1..65535 and differ from ${p}.port and ${workers}.")
]
