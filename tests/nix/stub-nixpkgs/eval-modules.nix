# A small stand-in for lib.evalModules, enough to evaluate modules/tenstorrent-serving.nix and
# the example host offline. What it does: imports (paths, functions, attribute sets), option
# declarations (nested attribute sets of mkOption), defaults, mkIf (pushed into attribute sets
# so that attribute names never depend on a condition), type checks against the declared type,
# unknown-option detection inside a declared option set, list concatenation across modules.
# What it does NOT do: priorities (mkDefault/mkForce/mkOverride), mkMerge, submodules, real
# type merging (a later definition simply wins), option declarations of the rest of NixOS
# (systemd, users, firewall... pass through undeclared and unchecked), assertion checking.
# A condition that is false leaves `null` where the value would be.
lib:
{ modules, specialArgs ? { }, pkgs ? { } }:
let
  inherit (builtins) isAttrs isList isFunction isPath attrNames concatMap filter foldl' all any;
  isOption = v: isAttrs v && (v._type or null) == "option";
  isIf = v: isAttrs v && (v._type or null) == "if";
  peel = v: if isIf v then peel v.content else v;
  plainAttrs = v: isAttrs v && !(v ? _type) && !(lib.isDerivation v);
  # An attribute view of a definition, with any mkIf condition pushed onto each attribute.
  view = v:
    if isIf v then builtins.mapAttrs (_: x: lib.mkIf v.condition x) (view v.content)
    else v;
  leaf = v: if isIf v then (if v.condition then leaf v.content else null) else v;
  unique = foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];
  namesOf = defs: unique (concatMap (d: if plainAttrs (peel d) then attrNames (view d) else [ ]) defs);
  sub = n: defs: concatMap (d: let v = view d; in if plainAttrs (peel d) && v ? ${n} then [ v.${n} ] else [ ]) defs;

  args = { inherit config options lib pkgs; utils = { }; modulesPath = "/stub/nixos/modules"; }
    // specialArgs;
  load = m:
    if isPath m || builtins.isString m then load (import m)
    else if isFunction m then load (m args)
    else m;
  expand = m: let v = load m; in [ v ] ++ concatMap expand (v.imports or [ ]);
  loaded = concatMap expand modules;
  structured = v: v ? options || v ? config;
  decls = map (v: v.options or { }) (filter structured loaded);
  defs = map (v: if structured v then v.config or { } else removeAttrs v [ "imports" "_file" "key" ]) loaded;

  mergeDecls = a: b:
    if isOption a || isOption b then b
    else a // builtins.mapAttrs (n: v: if a ? ${n} then mergeDecls a.${n} v else v) b;
  options = foldl' mergeDecls { } decls;

  present = ds: filter (x: x != null) (map leaf ds);
  mergeLeaves = ds:
    let vs = present ds; in
    if vs == [ ] then null
    else if all isList vs then builtins.concatLists vs
    else builtins.elemAt vs (builtins.length vs - 1);
  mergeDefs = ds:
    if ds != [ ] && all (d: plainAttrs (peel d)) ds
    then builtins.listToAttrs (map (n: { name = n; value = mergeDefs (sub n ds); }) (namesOf ds))
    else mergeLeaves ds;

  optionValue = opt: ds:
    let vs = present ds; in
    if vs == [ ] then opt.default or (throw "stub: option used but not defined")
    else if all isList vs then builtins.concatLists vs
    else builtins.elemAt vs (builtins.length vs - 1);

  build = opt: ds:
    if isOption opt then optionValue opt ds
    else if opt != null then
      builtins.listToAttrs (map (n: { name = n; value = build (opt.${n} or null) (sub n ds); })
        (unique (attrNames opt ++ namesOf ds)))
    else mergeDefs ds;
  config = build options defs;

  # Type errors and unknown options, as the messages the real module system would print.
  problems = opt: path: ds:
    let p = builtins.concatStringsSep "." path; in
    if isOption opt then
      (let v = optionValue opt ds; in
        if opt ? type && !(opt.type.check v)
        then [ "A definition for option `${p}' is not of type `${opt.type.description}'." ]
        else [ ])
    else
      (if any isOption (builtins.attrValues opt)
       then map (n: "The option `${p}.${n}' does not exist.")
         (filter (n: !(opt ? ${n})) (namesOf ds))
       else [ ])
      ++ concatMap (n: problems opt.${n} (path ++ [ n ]) (sub n ds)) (attrNames opt);
in
{
  inherit config options;
  stubProblems = problems options [ ] defs;
}
