# What the Tenstorrent runtime (ttnn 0.81.1 / tt-metal / UMD) reads and writes, as the unit
# provides it. Builtins only (tests/nix evaluates it without nixpkgs).
#
# Checked against the real wheel (ttnn 0.81.1 with a simulated chip, TT_METAL_SIMULATOR):
#   TT_METAL_RUNTIME_ROOT  root for tt_metal/ sources and runtime/sfpi; without it ttnn's
#                          __init__ calls SetRootDir(<package folder>) (ttnn/__init__.py)
#   TT_METAL_CACHE         JIT output: $TT_METAL_CACHE/tt-metal-cache<build key>/firmware,
#                          .../kernels and $TT_METAL_CACHE/tt-metal-cache/pch; without it
#                          $HOME/.cache/tt-metal-cache, else /tmp (strings in libtt_metal.so)
#   TT_METAL_LOGS_PATH     where generated/{inspector,fabric,watcher} go (else the working dir)
# UMD 0.9.14 opens /dev/tenstorrent/N and maps 1 GiB huge pages from a hugetlbfs mount
# (/dev/hugepages-1G), one host channel per MMIO device; with an active IOMMU it can use
# ordinary pages instead (libtt-umd.so: "IOMMU is required for sysmem without hugepages").
rec {
  name = "tenstorrent-serving";
  stateDir = "/var/lib/${name}";
  cacheDir = "/var/cache/${name}";
  logsDir = "/var/log/${name}";
  hugepageDir = "/dev/hugepages-1G";

  # The driver version UMD 0.9.14 requires (tt-umd kmd_versions.hpp KMD_MINIMUM_VERSION).
  kmdMinimum = "2.0.0";

  # A unit's own state, cache and log folders. Each replica (unit) gets its own: with
  # DynamicUser= every unit runs under its own uid, so two units must not share a folder.
  dirsFor = unit: {
    stateDir = "/var/lib/${unit}";
    cacheDir = "/var/cache/${unit}";
    logsDir = "/var/log/${unit}";
  };

  # runtimeRoot: the package's ttnnRuntimeRoot, or null (then ttnn picks its package folder).
  environment = { ttnn, runtimeRoot ? null, unit ? name }:
    let d = dirsFor unit; in
    {
      HOME = d.stateDir;
      XDG_CACHE_HOME = d.cacheDir;
    }
    // (if ttnn then
      {
        TT_METAL_CACHE = d.cacheDir;
        TT_METAL_LOGS_PATH = d.logsDir;
      }
      // (if runtimeRoot != null then { TT_METAL_RUNTIME_ROOT = runtimeRoot; } else { })
    else { });

  kernelDriverWarning = p:
    "${p}.kernelDriver.enable = false: the host configuration must load the Tenstorrent kernel "
    + "driver tt-kmd >= ${kmdMinimum} (required by the UMD in ttnn 0.81.1) so that "
    + "/dev/tenstorrent/N exist, e.g. boot.extraModulePackages = [ "
    + "config.boot.kernelPackages.tt-kmd ]; services.udev.packages = [ the same ]. "
    + "`tt-serve doctor --backend ttnn` checks it on the host.";
}
