# Defaults of the serve settings: the single source for the module's mkOption defaults.
# Builtins only. tt_serve/config/serve_config.py's ServeConfig holds the same values (a test
# keeps them equal).
{
  model = null; # null: the built-in demo model
  servedModelName = null;
  host = "127.0.0.1";
  port = 8000;
  backend = "torch";
  device = "cpu";
  deviceIds = [ 0 ];
  mesh = ""; # "": 1 x the number of deviceIds
  dtype = "auto";
  precision = "auto"; # auto: the ttnn default profile (bfloat16 today)
  deviceArgmax = true;
  deviceSampling = true;
  deviceResident = null; # null (auto): on for torch on CUDA, off elsewhere
  tracedPrefill = null; # null (auto): on for torch on CUDA, off elsewhere
  gpuMemoryUtilization = 0.9; # torch on CUDA: the fraction of GPU memory the server holds
  prefillChunk = 256;
  blockSize = 64;
  kvBlocks = 0; # 0: size the KV pool from free memory
  prefixCaching = {
    enable = true;
    snapshotSlots = 32;
  };
  resumePoints = "messages"; # chunks: cut only at prefill-chunk multiples (the A/B control)
  snapshotsPerConversation = 8; # 0: no cap
  hostCacheGb = 0; # GiB of host memory for the prefix cache's host tier; 0: off
  diskCacheDir = null; # folder of the disk tier (kept across restarts); null: off
  diskCacheGb = 64; # GiB the disk tier may hold
  diskWriteback = "resume"; # all: every unit written through (the A/B control)
  diskWriteMbPerS = 256; # average MiB/s the disk write-back may write; 0: unpaced
  diskReadAheadMb = 1024; # MiB of units read ahead for waiting requests; 0: reads in the step
  responseStoreEntries = 4096; # stored responses (previous_response_id); 0: none
  responseStoreMb = 256; # MiB the stored responses may hold
  maxBatchSize = 0; # 0: the backend's default (32 on torch, 16 on ttnn)
  maxWaiting = 256;
  maxNumBatchedTokens = 2048;
  maxPrefillRows = 0; # requests prefilling per step, earliest first (0: the backend's default)
  stepProbeSeconds = 20; # startup time for timing the steps the prefill-rows rule needs (0: none)
  maxModelLen = 0; # 0: the model's own context length
  traceRegionSize = 0; # 0: sized from the traces the ttnn backend captures
  apiKeyFile = null;
  logLevel = "info";
  drainTimeout = 30; # seconds SIGTERM waits for requests in flight before the server exits
  # Replicas behind a router (empty: one server on host:port, no router).
  instances = [ ]; # device groups, one worker each: [ [ 0 ] [ 1 ] ]
  workerBasePort = 8100; # worker i listens on 127.0.0.1:(workerBasePort + i)
  routerPolicy = "cache_aware";
  routerPrometheusPort = 29000;
}
