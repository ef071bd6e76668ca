# sglang-router (not in nixpkgs): the SGLang model gateway, a Rust router in a Python wheel
# (`smg launch ...`), in front of tt-serve replicas. Installed from the pinned abi3 wheel;
# why this router and these flags: docs/routing.md.
{ lib, stdenv, buildPythonPackage, fetchurl, autoPatchelfHook, aiohttp, fastapi, orjson
, setproctitle, uvicorn }:
let
  pin = (import ./pins.nix).sglang-router;
in
buildPythonPackage {
  pname = pin.pname;
  inherit (pin) version;
  format = "wheel";
  src = fetchurl { inherit (pin) url hash; };
  nativeBuildInputs = [ autoPatchelfHook ];
  buildInputs = [ stdenv.cc.cc.lib ];
  dependencies = [ aiohttp fastapi orjson setproctitle uvicorn ];
  pythonImportsCheck = [ "sglang_router" ];
  meta = {
    description = "SGLang model gateway: cache-aware router for OpenAI-compatible workers";
    license = lib.licenses.asl20;
    mainProgram = "smg";
    platforms = [ "x86_64-linux" ];
  };
}
