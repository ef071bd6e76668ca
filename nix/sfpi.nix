# SFPI: Tenstorrent's RISC-V cross compiler (riscv-tt-elf-g++, binutils, headers). ttnn 0.81.1
# compiles its firmware and every kernel with it at run time, but the wheel does not ship it;
# the wheel only records which release it needs, in ttnn/tt_metal/sfpi-version
# (tests/nix/test_sfpi.py keeps nix/pins.json equal to that file).
#
# tt-metal looks for <runtime root>/runtime/sfpi/compiler/bin/riscv-tt-elf-g++ and then
# /opt/tenstorrent/sfpi (tt_metal/jit_build/build.cpp; checked against the real wheel with a
# simulated chip: it runs `<that path> --version`, then compiles with -I<root>/runtime/sfpi/include).
# nix/ttnn.nix links this package there.
#
# Verified offline: the URL pattern (sfpi-info.sh in the wheel: <repo>/releases/download/
# <version>/sfpi_<version>_<arch>_<dist>.<pkg>) and the hash (the wheel's
# sfpi_x86_64_debian_txz_hash, as SRI). NOT verified (needs a networked Nix machine):
# that the archive unpacks to ./sfpi (what tt-llk's setup script assumes: sfpi/sfpi.version),
# the exact shared libraries its host binaries need (the buildInputs below are those a
# GCC/binutils build usually links; autoPatchelf fails the build on any other missing one), and
# that the compiler runs after patching (installCheckPhase compiles a file to find out).
{ lib, stdenv, fetchurl, autoPatchelfHook, xz, zlib, zstd, gmp, mpfr, libmpc, expat, ncurses }:
let
  pin = (import ./pins.nix).sfpi;
in
stdenv.mkDerivation {
  pname = pin.pname;
  inherit (pin) version;
  src = fetchurl { inherit (pin) url hash; };

  nativeBuildInputs = [ autoPatchelfHook xz ];
  buildInputs = [ stdenv.cc.cc.lib zlib zstd gmp mpfr libmpc expat ncurses ];
  # gdb's Python scripting, if the release links it, is not needed to compile kernels.
  autoPatchelfIgnoreMissingDeps = [ "libpython3*" ];

  sourceRoot = "sfpi";
  dontConfigure = true;
  dontBuild = true;
  # The RISC-V target libraries (libgcc.a, crt*.o, newlib) must not pass through the host strip;
  # autoPatchelf leaves non-x86_64 ELF files alone.
  dontStrip = true;

  installPhase = ''
    runHook preInstall
    mkdir -p $out
    cp -a . $out/
    runHook postInstall
  '';

  doInstallCheck = true;
  installCheckPhase = ''
    runHook preInstallCheck
    test "$(cat $out/sfpi.version)" = "${pin.version}"
    $out/compiler/bin/riscv-tt-elf-g++ --version
    echo 'int f(int x) { return x + 1; }' > probe.cc
    $out/compiler/bin/riscv-tt-elf-g++ -mcpu=tt-wh -O2 -c probe.cc -o probe.o
    runHook postInstallCheck
  '';

  passthru = { inherit (pin) build; };

  meta = {
    description = "Tenstorrent SFPI RISC-V toolchain (binary release) for tt-metal's JIT";
    homepage = "https://github.com/tenstorrent/sfpi";
    license = with lib.licenses; [ asl20 gpl3Plus ];
    sourceProvenance = [ lib.sourceTypes.binaryNativeCode ];
    platforms = [ "x86_64-linux" ];
  };
}
