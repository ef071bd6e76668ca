# Defaults of the module-only options (host and unit settings that are not `tt-serve serve`
# flags, so tt_serve/config/serve_config.py's ServeConfig does not mirror them; defaults.nix
# holds those).
# Builtins only; tests/nix/test_module_stub.py checks the module's defaults against this file.
{
  hugepages = {
    enable = true;
    count = 4;
  };
  kernelDriver.enable = true;
  preStartCheck = true;
  # First boot compiles the firmware and every kernel with SFPI before /health answers; later
  # boots reuse the kernel cache (runtime.nix). The readiness wait and TimeoutStartSec= both
  # derive from this.
  startTimeoutMinutes = 60;
  # With instances: a switch restarts the workers one at a time (lib/rollout.nix).
  rollingRestart.enable = true;
}
