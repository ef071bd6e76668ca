# ttnn, the Tenstorrent runtime, from the pinned PyPI wheel (cp312 manylinux only, hence
# Python 3.12). The wheel bundles tt-metal, UMD and its own copies of hwloc/numa/MPI;
# autoPatchelf points the rest at nixpkgs' libraries. The SFPI compiler, which the wheel lacks,
# is linked in as ttnn/runtime/sfpi: ttnn's __init__ makes the package folder the runtime root
# (SetRootDir) unless TT_METAL_RUNTIME_ROOT is set, and tt-metal looks for
# <root>/runtime/sfpi/compiler/bin/riscv-tt-elf-g++ (see nix/sfpi.nix).
{ lib, stdenv, buildPythonPackage, fetchurl, python, autoPatchelfHook, zlib, sfpi
, numpy, loguru, networkx, graphviz, pyyaml, click, pandas, seaborn, ml-dtypes }:
let
  pin = (import ./pins.nix).ttnn;
in
buildPythonPackage {
  pname = pin.pname;
  inherit (pin) version;
  format = "wheel";
  disabled = python.pythonVersion != "3.12";
  src = fetchurl { inherit (pin) url hash; };

  nativeBuildInputs = [ autoPatchelfHook ];
  buildInputs = [ stdenv.cc.cc.lib zlib ];
  dependencies = [ numpy loguru networkx graphviz pyyaml click pandas seaborn ml-dtypes ];
  # The wheel asks for numpy<2; nixpkgs ships numpy 2 and torch is built against it. tt-serve
  # passes numpy arrays to ttnn only through its documented host-tensor API; verify on hardware.
  pythonRelaxDeps = [ "numpy" ];
  pythonImportsCheck = [ "ttnn" ];

  postInstall = ''
    test -d $out/${python.sitePackages}/ttnn/runtime
    ln -s ${sfpi} $out/${python.sitePackages}/ttnn/runtime/sfpi
  '';

  passthru = { inherit sfpi; };

  meta = {
    description = "Tenstorrent neural network op library (tt-metal), binary wheel";
    homepage = "https://github.com/tenstorrent/tt-metal";
    license = lib.licenses.asl20;
    sourceProvenance = [ lib.sourceTypes.binaryNativeCode ];
    platforms = [ "x86_64-linux" ];
  };
}
