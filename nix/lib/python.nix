# pyproject.toml's dependency strings -> nixpkgs python package attribute names.
{ lib }:
{
  # "jinja2>=3.1" -> "jinja2", "PyYAML[extra] ; python_version>'3'" -> "pyyaml".
  requirementName =
    req:
    let
      m = builtins.match "[[:space:]]*([A-Za-z0-9][A-Za-z0-9._-]*).*" req;
    in
    if m == null then
      throw "krun-gpu: cannot read a package name from requirement '${req}'"
    else
      lib.toLower (builtins.replaceStrings [ "_" "." ] [ "-" "-" ] (lib.head m));
}
