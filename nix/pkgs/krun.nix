# The `nix profile add .#krun` target: everything the host side of krun-gpu needs in one profile
# entry. route "venus" (macOS default): krunkit linked to the krunkit virglrenderer, no APIR
# settings at all (VIRGL_ROUTE_VENUS_TO_APIR would break Venus for the whole VM). route "apir"
# (.#krun-apir on macOS, .#krun on Linux): the APIR virglrenderer and ggml backend; krunkit is wrapped so virglrenderer's APIR loader finds the ggml backend by
# default (--set-default: a caller's own value still wins); no DYLD_LIBRARY_PATH, which macOS
# strips for protected processes and which would not survive ssh anyway. `krun-env` prints the
# same settings as shell exports for launchers that start a VMM themselves (QEMU on Linux).
{
  lib,
  stdenv,
  symlinkJoin,
  makeWrapper,
  writeShellScriptBin,
  runCommand,
  ggml-virtgpu-backend,
  virglrenderer-apir,
  virglrenderer-venus ? null,
  krunkit-gpu,
  withKrunkit ? stdenv.hostPlatform.isDarwin,
  route ? "apir",
}:
assert lib.assertMsg (lib.elem route [
  "venus"
  "apir"
]) "krun-gpu: krun route must be \"venus\" or \"apir\", not ${route}";
let
  apir = route == "apir";
  env = if apir then ggml-virtgpu-backend.runtimeEnv else { };
  names = lib.attrNames env;

  krun-env = writeShellScriptBin "krun-env" ''
    # Shell exports that point virglrenderer's APIR context at the ggml backend of this profile.
    ${lib.concatMapStrings (n: "echo ${lib.escapeShellArg "export ${n}=${lib.escapeShellArg env.${n}}"}\n") names}
  '';

  wrapperArgs = lib.concatMapStringsSep " " (
    n: "--set-default ${n} ${lib.escapeShellArg env.${n}}"
  ) names;

  # The bundle's own wrapper and krun-env must carry every setting, and every path must exist.
  wrapperTest =
    bundle:
    runCommand "krun-wrapper-env" { } (
      ''
        ${krun-env}/bin/krun-env > exports
      ''
      + lib.concatMapStrings (n: ''
        grep -qxF ${lib.escapeShellArg "export ${n}=${lib.escapeShellArg env.${n}}"} exports
      '') names
      + lib.concatMapStrings (n: ''
        test -e ${lib.escapeShellArg env.${n}}
      '') (lib.filter (n: n != "APIR_LLAMA_CPP_GGML_LIBRARY_REG") names)
      + lib.optionalString withKrunkit (
        lib.concatMapStrings (n: ''
          grep -qF ${lib.escapeShellArg env.${n}} ${bundle}/bin/krunkit
        '') names
      )
      + ''
        touch $out
      ''
    );

  bundle = symlinkJoin {
    name = if apir then "krun" else "krun-venus";
    paths =
      (
        if apir then
          [
            ggml-virtgpu-backend
            virglrenderer-apir
          ]
        else
          [ krunkit-gpu.libkrun.virglrenderer ]
      )
      ++ [ krun-env ]
      ++ lib.optional withKrunkit krunkit-gpu;

    nativeBuildInputs = [ makeWrapper ];

    # share/krun-gpu/route tells `provision launch/doctor` which virglrenderer this bundle carries.
    postBuild = ''
      mkdir -p $out/share/krun-gpu
      echo ${route} > $out/share/krun-gpu/route
    ''
    + lib.optionalString (withKrunkit && apir) ''
      wrapProgram $out/bin/krunkit ${wrapperArgs}
    '';

    passthru = {
      inherit env krun-env route;
      virglrenderer = if apir then virglrenderer-apir else krunkit-gpu.libkrun.virglrenderer;
      krunkit = if withKrunkit then krunkit-gpu else null;
      tests.wrapperEnv = wrapperTest bundle;
    };

    meta = {
      description =
        if apir then
          "krun-gpu host bundle, APIR route: krunkit (macOS), virglrenderer with APIR, the ggml APIR backend, krun-env"
        else
          "krun-gpu host bundle, Venus route: krunkit linked to the krunkit virglrenderer (MoltenVK)";
      mainProgram = if withKrunkit then "krunkit" else "krun-env";
      platforms = lib.platforms.darwin ++ lib.platforms.linux;
    };
  };
in
bundle
