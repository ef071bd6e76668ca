# Evaluates modules/tenstorrent-serving.nix against the stand-in lib (stub-nixpkgs) with the
# given `services.tenstorrent-serving` settings (a JSON string, NixOS option names) and returns
# what tests/nix/test_module_stub.py checks. Usage:
#   nix-instantiate --eval --strict --json tests/nix/eval-stub.nix --argstr settings '{...}'
{ settings ? "{}" }:
let
  lib = import ./stub-nixpkgs/lib.nix;
  eval = lib.nixosSystem {
    modules = [
      ../../modules/tenstorrent-serving.nix
      { services.tenstorrent-serving = builtins.fromJSON settings; }
      # Stand-in for the host's kernel package set: callPackage returns a fake derivation named
      # after the file it was given, so the test sees which recipe the module builds.
      {
        boot.kernelPackages.callPackage = fn: _: {
          type = "derivation";
          name = "kmod-${baseNameOf fn}";
          outPath = "/nix/store/00000000000000000000000000000000-kmod";
        };
      }
    ];
  };
  c = eval.config;
  opts = eval.options.services.tenstorrent-serving;
  unit = c.systemd.services.tenstorrent-serving or null;
  enabled = c.services.tenstorrent-serving.enable;
  # The single-server unit (absent with instances: see `units`).
  single = enabled && unit != null;
  names = ps: if ps == null then null else map (x: x.name) ps;
  names' = ps: map (x: x.name) ps;
in
{
  problems = eval.stubProblems;
  options = builtins.attrNames opts;
  # name -> { type; description; } of each top-level option (nested sets are left out).
  optionInfo = builtins.listToAttrs (map
    (n: {
      name = n;
      value = { type = opts.${n}.type.description; inherit (opts.${n}) description; };
    })
    (builtins.filter (n: (opts.${n}._type or null) == "option") (builtins.attrNames opts)));
  failedAssertions =
    map (a: a.message) (builtins.filter (a: !a.assertion) (if enabled then c.assertions else [ ]));
  execStart = if single then unit.serviceConfig.ExecStart else null;
  execStartPost = if single then unit.serviceConfig.ExecStartPost else null;
  serviceConfig = if single then unit.serviceConfig else null;
  unitConfig = if single then unit.unitConfig else null;
  environment = if single then unit.environment else null;
  firewallPorts = c.networking.firewall.allowedTCPPorts or null;
  kernelParams = c.boot.kernelParams or null;
  mounts = map (m: m.where) (if (c.systemd.mounts or null) == null then [ ] else c.systemd.mounts);
  udevRules = c.services.udev.extraRules or null;
  execStartPre = if single then unit.serviceConfig.ExecStartPre else null;
  extraModulePackages = names (c.boot.extraModulePackages or null);
  kernelModules = c.boot.kernelModules or null;
  udevPackages = names (c.services.udev.packages or null);
  warnings = c.warnings or null;
  # Every unit the module defines (one server, or workers plus the router), by name.
  units = if !enabled then null else builtins.mapAttrs
    (_: u: {
      inherit (u) description;
      # A unit with `script` (the rollout) has no ExecStart= here: the real NixOS writes one.
      execStart = u.serviceConfig.ExecStart or null;
      script = u.script or null;
      path = names' (u.path or [ ]);
      type = u.serviceConfig.Type or null;
      remainAfterExit = u.serviceConfig.RemainAfterExit or null;
      timeoutStartSec = u.serviceConfig.TimeoutStartSec or null;
      restartIfChanged = u.restartIfChanged or null;
      stopIfChanged = u.stopIfChanged or null;
      restartTriggers = u.restartTriggers or [ ];
      after = u.after or [ ];
      before = u.before or [ ];
      wantedBy = u.wantedBy or [ ];
      execStartPost = u.serviceConfig.ExecStartPost or null;
      timeoutStopSec = u.serviceConfig.TimeoutStopSec or null;
      stateDirectory = u.serviceConfig.StateDirectory or null;
      home = (u.environment or { }).HOME or null;
      wants = u.wants or [ ];
    })
    c.systemd.services;
  # The module-only settings, as the module resolved them (defaults included).
  hostSettings = {
    inherit (c.services.tenstorrent-serving) hugepages kernelDriver preStartCheck
      startTimeoutMinutes rollingRestart;
  };
}
