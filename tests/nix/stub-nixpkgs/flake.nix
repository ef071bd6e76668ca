# Offline stand-in for the nixpkgs flake input, for tests only:
#   nix eval --override-input nixpkgs path:./tests/nix/stub-nixpkgs .#...
# It has a small lib (see lib.nix) and fake packages; nothing here builds.
{
  outputs = { self }: {
    lib = import ./lib.nix;
    legacyPackages.x86_64-linux = import ./pkgs.nix;
  };
}
