# Rolling restarts of the replicas (cfg.instances) on `nixos-rebuild switch`. Builtins only
# (tests/nix runs the script with a fake systemctl and curl).
#
# Without this, switch-to-configuration restarts every changed worker unit in one
# `systemctl restart` (or stop, then start), so all replicas drain together and the router has no
# healthy worker. Instead (modules/tenstorrent-serving.nix wires it):
#   - the workers have restartIfChanged = false, so a switch leaves them running;
#   - tenstorrent-serving-rollout, a oneshot with RemainAfterExit= (so it stays active and a
#     changed definition restarts it), has one restartTrigger per worker (a hash of that worker's
#     definition as the module writes it) and the worker list in its script, so any change to a
#     worker changes it; its script restarts the active workers one at a time.
#
# What this relies on, in NixOS (nixos/lib/systemd-unit-options.nix and switch-to-configuration,
# both the Perl script and switch-to-configuration-ng's handle_modified_unit):
#   - restartIfChanged = false writes X-RestartIfChanged=false, which the switch reads from the
#     NEW unit file: a changed unit with it is listed "NOT restarting the following changed
#     units" and left alone (also on the switch that first sets it).
#   - only units that are active or activating and whose unit file changed are restarted; the
#     default stopIfChanged = true stops them in the old configuration and starts them after
#     activation; stopIfChanged = false restarts them in one step in the new configuration,
#     after daemon-reload, in the switch's restart phase, whose jobs the switch waits for.
#   - restartTriggers only end up in the unit file (X-Restart-Triggers=), so a changed trigger
#     makes the unit "changed"; a new unit wanted by multi-user.target is started when the switch
#     starts the active targets, and so is a failed one (not active, hence not "changed").
#   - `script` becomes ExecStart (a bash script run with -e); `path` is added to PATH, after
#     which NixOS appends coreutils, findutils, gnugrep, gnused and systemd (systemctl).
# No ordering between the rollout and the workers: it starts restart jobs on them from its own
# start job, which an After=/Before= between them would deadlock.
#
# At boot the rollout starts beside the workers, finds them activating (not "active": that needs
# /health to answer, lib/args.nix healthProbe) and restarts nothing. A worker that is not active
# serves nothing; whatever starts it next (Restart=on-failure, the switch starting
# multi-user.target, an operator) uses the new definition. A worker whose start was already under
# way when the switch ran keeps the old one until it is restarted (rare: the start was recent).
let
  args = import ./args.nix;
  h = args.routerHealth;
in
rec {
  # After `systemctl restart` returns (the unit is started: its ExecStartPost= probe saw /health
  # answer 200), /health is asked again, every healthDelaySeconds, at most healthTries times:
  # the worker must still be up when the next one drains.
  healthTries = 30;
  healthDelaySeconds = 2;
  curlMaxTimeSeconds = 5;
  healthWaitSeconds = healthTries * (curlMaxTimeSeconds + healthDelaySeconds);

  # Before draining the next worker, the one just restarted must be back in the router's
  # rotation: its health check needs successThreshold passes at intervalSecs, and a circuit that
  # opened while it was down (503 while draining, connection refused) stays open circuitOpenSecs.
  # With two replicas, draining the second earlier would leave the router none.
  settleSeconds = h.circuitOpenSecs + h.successThreshold * h.intervalSecs;

  # The bound on the whole rollout (TimeoutStartSec= of the oneshot): per worker its stop
  # (drain) and start bounds, the health wait and the settle, plus a minute.
  timeoutStartSec = cfg: workers:
    let
      stop = cfg.drainTimeout + args.stopMarginSeconds;
      start = args.startTimeoutMinutes cfg * 60;
      each = stop + start + healthWaitSeconds + settleSeconds;
    in
    "${toString (builtins.length workers * each + 60)}s";

  # units: [ { name; healthUrl; } ] in rollout order. Unit names and URLs are plain words
  # (tenstorrent-serving-worker-<i>, http://127.0.0.1:<port>/health): no shell quoting needed.
  script = units: ''
    # Rolling restart of the tt-serve workers, one at a time (modules/lib/rollout.nix).
    previous=""

    restart_worker() {
      unit=$1
      url=$2
      state=$(systemctl is-active "$unit" || true)
      if [ "$state" != active ]; then
        echo "$unit is $state, not serving: not restarted (its next start uses the new definition)"
        return 0
      fi
      if [ -n "$previous" ]; then
        echo "waiting ${toString settleSeconds} s for the router to take $previous back before $unit drains"
        sleep ${toString settleSeconds}
      fi
      echo "restarting $unit"
      if ! systemctl restart "$unit"; then
        echo "rolling restart stopped: $unit did not come back (systemctl restart $unit failed, see journalctl -u $unit); the workers after it keep their old definition" >&2
        exit 1
      fi
      tries=1
      until curl --silent --fail --output /dev/null --max-time ${toString curlMaxTimeSeconds} "$url"; do
        if [ "$tries" -ge ${toString healthTries} ]; then
          echo "rolling restart stopped: $unit did not report healthy on $url (${toString healthTries} tries, ${toString healthDelaySeconds} s apart); the workers after it keep their old definition" >&2
          exit 1
        fi
        tries=$((tries + 1))
        sleep ${toString healthDelaySeconds}
      done
      echo "$unit is healthy on $url"
      previous=$unit
    }

  '' + builtins.concatStringsSep "" (map (u: "restart_worker ${u.name} ${u.healthUrl}\n") units);
}
