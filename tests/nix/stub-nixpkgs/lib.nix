# Test stand-in for the subset of nixpkgs `lib` that modules/tenstorrent-serving.nix and
# flake.nix use. It is NOT the module system: see eval-modules.nix for what it leaves out.
let
  lib = {
    mkOption = attrs: attrs // { _type = "option"; };
    mkEnableOption = name: lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Whether to enable ${name}.";
    };
    mkIf = condition: content: { _type = "if"; inherit condition content; };
    literalExpression = text: { _type = "literalExpression"; inherit text; };
    optionals = cond: xs: if cond then xs else [ ];
    optionalAttrs = cond: as: if cond then as else { };
    optionalString = cond: s: if cond then s else "";
    isDerivation = v: builtins.isAttrs v && (v.type or null) == "derivation";

    types =
      let
        mk = description: check: { inherit description check; };
        isInt = builtins.isInt;
      in
      rec {
        bool = mk "boolean" builtins.isBool;
        int = mk "signed integer" isInt;
        number = mk "signed integer or floating point number" (v: isInt v || builtins.isFloat v);
        float = mk "floating point number" builtins.isFloat;
        str = mk "string" builtins.isString;
        path = mk "path" (v: builtins.isPath v || (builtins.isString v && builtins.substring 0 1 v == "/"));
        port = mk "16 bit unsigned integer; between 0 and 65535 (both inclusive)"
          (v: isInt v && v >= 0 && v <= 65535);
        package = mk "package" lib.isDerivation;
        ints.positive = mk "positive integer, meaning >0" (v: isInt v && v > 0);
        enum = values: mk "one of ${builtins.concatStringsSep ", " (map builtins.toJSON values)}"
          (v: builtins.elem v values);
        nullOr = t: mk "null or ${t.description}" (v: v == null || t.check v);
        either = a: b: mk "${a.description} or ${b.description}" (v: a.check v || b.check v);
        listOf = t: mk "list of ${t.description}" (v: builtins.isList v && builtins.all t.check v);
        attrsOf = t: mk "attribute set of ${t.description}"
          (v: builtins.isAttrs v && builtins.all t.check (builtins.attrValues v));
      };

    evalModules = import ./eval-modules.nix lib;

    # nixpkgs' nixosSystem, reduced to the stand-in evaluator with the fake packages.
    nixosSystem = { modules, specialArgs ? { }, system ? null, ... }:
      lib.evalModules { inherit modules specialArgs; pkgs = import ./pkgs.nix; };
  };
in
lib
