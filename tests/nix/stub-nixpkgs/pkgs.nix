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
  tt-serve = fake "tt-serve-stub";
  curl = fake "curl-stub";
}
