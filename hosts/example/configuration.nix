# Example Tenstorrent host: `nixos-rebuild switch --flake .#example`.
# Replace the hardware parts (disks, boot loader) with your machine's
# hardware-configuration.nix. The module builds and loads the Tenstorrent kernel driver
# (tt-kmd, pinned) for this host's kernel, so /dev/tenstorrent/N exist; run
# `tt-serve doctor --backend ttnn` on the host to check the rest.
{ ... }:
{
  networking.hostName = "tt-example";
  nixpkgs.hostPlatform = "x86_64-linux";
  system.stateVersion = "25.11";

  boot.loader.systemd-boot.enable = true;
  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };

  services.tenstorrent-serving = {
    enable = true;
    backend = "ttnn";
    deviceIds = [ 0 ];
    precision = "mixed"; # MLP and expert weights in bfloat8_b; the rest bfloat16
    model = "/srv/models/Qwen3.6-35B-A3B";
    servedModelName = "qwen3.6";
    host = "0.0.0.0";
    port = 8000;
    openFirewall = true;
    deviceArgmax = true;
    deviceResident = true;
    tracedPrefill = true;
    prefillChunk = 2048;
    blockSize = 64;
    prefixCaching = {
      enable = true;
      snapshotSlots = 64;
    };
    # Conversations the device pool lost come back from host memory, and from disk after a
    # restart (the KV + GDN snapshot of each resume point, bit for bit).
    hostCacheGb = 96;
    diskCacheDir = "/var/cache/tt-serve";
    diskCacheGb = 512;
    maxBatchSize = 32;
    maxNumBatchedTokens = 4096;
    # Created out of band (not in the Nix store), readable by root only.
    apiKeyFile = "/run/keys/tt-serve-api-key";
  };
}
