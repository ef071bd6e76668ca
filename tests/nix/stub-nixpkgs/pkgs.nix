# Fake packages for the stand-in: attribute sets that look like derivations (type, name,
# outPath) so that "${pkgs.curl}/bin/curl" interpolates. They cannot be built.
let
  fake = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };
in
{
  # Like nix/package.nix's passthru: the folder the unit sets as TT_METAL_RUNTIME_ROOT.
  tt-serve = fake "tt-serve-stub" // {
    ttnnRuntimeRoot = "${(fake "ttnn-stub").outPath}/lib/python3.12/site-packages/ttnn";
  };
  curl = fake "curl-stub";
  stdenv.cc = fake "gcc-wrapper-stub";
  binutils = fake "binutils-wrapper-stub";
  sglang-router = fake "sglang-router-stub";
}
