# tt-kmd, the Tenstorrent kernel driver (/dev/tenstorrent/N), built from the pinned tag for the
# host's kernel: call it with `config.boot.kernelPackages.callPackage`. The recipe follows
# nixpkgs' pkgs/os-specific/linux/tt-kmd and tt-kmd's own README ("With NixOS":
# boot.extraModulePackages + services.udev.packages).
#
# ttnn 0.81.1 bundles UMD 0.9.14, which refuses drivers older than 2.0.0 (KMD_MINIMUM_VERSION in
# tt-umd device/api/umd/device/utils/kmd_versions.hpp; the value 2.0.0 was read from the wheel's
# libtt-umd.so). 2.10.0 is the newest tag this pin was hashed from (the hash of the tag's tree,
# computed from a git checkout with `nix hash path`; the same method reproduces nixpkgs' hashes
# for 2.5.0 and 2.7.0). NOT verified: building against a real kernel (needs nixpkgs).
{ lib, stdenv, fetchzip, kernel, kernelModuleMakeFlags ? [ ] }:
let
  pin = (import ./pins.nix).tt-kmd;
in
stdenv.mkDerivation (finalAttrs: {
  pname = pin.pname;
  inherit (pin) version;
  src = fetchzip { inherit (pin) url hash; };

  nativeBuildInputs = kernel.moduleBuildDependencies;
  makeFlags = kernelModuleMakeFlags;
  buildFlags = [ "KDIR=${kernel.dev}/lib/modules/${kernel.modDirVersion}/build" ];
  installFlags = finalAttrs.buildFlags ++ [
    "INSTALL_MOD_PATH=${placeholder "out"}"
    "INSTALL_MOD_DIR=misc"
  ];
  installTargets = [ "modules_install" ];

  postInstall = ''
    mkdir -p $out/lib/udev/rules.d
    cp udev-50-tenstorrent.rules $out/lib/udev/rules.d/50-tenstorrent.rules
  '';

  meta = {
    description = "Tenstorrent kernel driver";
    homepage = "https://github.com/tenstorrent/tt-kmd";
    license = lib.licenses.gpl2Only;
    platforms = lib.platforms.linux;
  };
})
