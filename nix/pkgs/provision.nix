# The `provision` CLI, packaged from pyproject.toml (name, version, dependencies read from it).
{
  lib,
  python3Packages,
  krunLib,
}:
let
  root = ../..;
  pyproject = lib.importTOML (root + "/pyproject.toml");
  project = pyproject.project;
  # Only what the wheel is built from; tests, docs and nix files do not reach the build.
  keep = [
    "pyproject.toml"
    "README.md"
    "LICENSE"
    "provision"
  ];
  src = builtins.path {
    name = "krun-gpu-source";
    path = root;
    filter =
      path: type:
      let
        rel = lib.removePrefix (toString root + "/") (toString path);
        top = lib.head (lib.splitString "/" rel);
      in
      lib.elem top keep && !(lib.hasSuffix ".pyc" rel) && baseNameOf path != "__pycache__";
  };
in
python3Packages.buildPythonApplication {
  pname = project.name;
  inherit (project) version;
  pyproject = true;
  inherit src;

  build-system = [ python3Packages.setuptools ];
  dependencies = map (req: python3Packages.${krunLib.python.requirementName req}) project.dependencies;

  # The suite drives podman, QEMU and nix; it runs in CI, not in the sandbox.
  doCheck = false;
  pythonImportsCheck = [ "provision" ];

  meta = {
    description = project.description;
    license = lib.licenses.mit;
    mainProgram = "provision";
    platforms = lib.platforms.darwin ++ lib.platforms.linux;
  };
}
