# TEST DOUBLE of nixpkgs for evaluating the krun-gpu flake with Debian's nix 2.8 (real nixpkgs
# needs nix >= 2.18, lib/minver.nix). It is NOT nixpkgs and can build nothing: every derivation is
# a real `derivation` (builder /bin/sh) that only prints that it is a stub, so `nix flake check
# --no-build`, `nix flake show` and `nix eval .#…drvAttrs` work and show exactly what our
# expressions hand to nixpkgs.
#
# What it mirrors (names, argument sets, calling conventions), checked against NixOS/nixpkgs:
#   import nixpkgs { system; overlays; config; }           pkgs/top-level/impure.nix
#   callPackage (auto-arguments, .override, errors on a missing argument)  lib/customisation.nix
#   stdenv.mkDerivation (finalAttrs: …), .overrideAttrs (old: …) / (final: prev: …),
#     env merged into the derivation, passthru/meta on the result, finalAttrs.finalPackage
#                                                           pkgs/stdenv/generic/make-derivation.nix
#   fetchFromGitHub { owner repo rev|tag hash }, fetchFromGitLab { domain … }, fetchurl { url hash },
#     fetchPypi { pname version hash }: fixed-output derivations carrying outputHash
#                                                           pkgs/build-support/fetch{github,gitlab,url,pypi}
#   rustPlatform.{fetchCargoVendor, cargoSetupHook, bindgenHook}  pkgs/build-support/rust
#   symlinkJoin { name paths postBuild }, makeWrapper, writeShellScriptBin, runCommand, runCommandCC,
#     mkShell                                              pkgs/build-support/trivial-builders
#   libkrun (withBlk/withNet/withGpu/… -> makeFlags)       pkgs/by-name/li/libkrun/package.nix
#   krunkit (firmware in share/krunkit)                    pkgs/by-name/kr/krunkit/package.nix
#   libkrun-efi, virglrenderer, moltenvk (out/bin/dev), llama-cpp-style cudaPackages, nixfmt-tree,
#   python3.withPackages, python3Packages.buildPythonApplication, buildPackages.pkgsCross.
#     aarch64-multiplatform.pkgsStatic
# The ARGUMENT SETS of libkrun, libkrun-efi, krunkit, virglrenderer and moltenvk are not written
# here: they come from facts.json, which checks/upstream-facts generates from the nixpkgs package
# files it read (the same read as nix/facts/upstream.json). callPackage fills exactly those
# arguments, and `.override` with an argument the real function does not take fails as in nixpkgs.
# Versions of packages defined here are "0-stub"; their sources carry `sha256 = <hex sha256 of a
# "stub-nixpkgs:…" label>`, never an SRI hash, so the tests can tell a hash nixpkgs would supply
# from one krun-gpu supplies (every SRI hash in a krun-gpu closure must come from pins.json).
{
  system ? builtins.currentSystem,
  localSystem ? {
    inherit system;
  },
  crossSystem ? null,
  overlays ? [ ],
  config ? { },
  isStatic ? false,
}:
let
  lib = import ./lib.nix;

  factsArgs = (builtins.fromJSON (builtins.readFile ./facts.json)).packages;

  # A package function with the argument set nixpkgs' package.nix has (facts.json); `body` takes
  # what it is given (its formals end in `...`) and supplies its own defaults.
  fromFacts =
    name: body:
    let
      args = factsArgs.${name} or (throw "stub nixpkgs: facts.json has no argument set for ${name}");
    in
    lib.setFunctionArgs (
      given:
      let
        unexpected = lib.filter (n: !(args ? ${n})) (lib.attrNames given);
      in
      if unexpected != [ ] then
        throw "stub nixpkgs: ${name}'s package function called with unexpected argument '${lib.head unexpected}' (it takes: ${lib.concatStringsSep ", " (lib.attrNames args)})"
      else
        body given
    ) args;

  buildSystem = localSystem.system or localSystem;
  hostConfig = if crossSystem == null then null else crossSystem.config or crossSystem;

  platformOf =
    sys: cfg:
    let
      parts = lib.splitString "-" sys;
      cpu = lib.head parts;
      kernel = lib.last parts;
    in
    {
      system = sys;
      config = if cfg != null then cfg else "${cpu}-unknown-${kernel}";
      isDarwin = kernel == "darwin";
      isLinux = kernel == "linux";
      isAarch64 = cpu == "aarch64";
      isx86_64 = cpu == "x86_64";
      inherit isStatic;
      extensions.sharedLibrary = if kernel == "darwin" then ".dylib" else ".so";
      darwinMinVersion = "14.0";
    };

  hostSystem =
    if hostConfig == null then
      buildSystem
    else
      let
        p = lib.splitString "-" hostConfig;
      in
      "${lib.head p}-${lib.elemAt p 2}";

  buildPlatform = platformOf buildSystem null;
  hostPlatform = platformOf hostSystem hostConfig;

  stubBuilder = [
    "-c"
    "echo 'stub-nixpkgs: evaluation-only test double, nothing can be built' >&2; exit 1"
  ];

  # Turn mkDerivation-style attributes into what builtins.derivation accepts, as nixpkgs does:
  # `env` is merged in, passthru/meta stay off the .drv, nulls are dropped.
  toDrvAttrs =
    attrs:
    let
      env = attrs.env or { };
      clash = lib.filter (n: attrs ? ${n}) (lib.attrNames env);
      plain = removeAttrs attrs [
        "env"
        "passthru"
        "meta"
        "finalPackage"
        "pos"
      ];
    in
    assert lib.assertMsg (clash == [ ])
      "stub mkDerivation: ${lib.concatStringsSep ", " clash} set in both env and the derivation (nixpkgs refuses this too)";
    lib.filterAttrs (_: v: v != null) (plain // env);

  mkDerivationFor =
    platform: fnOrAttrs:
    let
      rattrs0 = if lib.isFunction fnOrAttrs then fnOrAttrs else (_: fnOrAttrs);
      extensible =
        rattrs:
        let
          finalAttrs = rattrs (finalAttrs // { inherit finalPackage; });
          name = finalAttrs.name or "${finalAttrs.pname}-${finalAttrs.version}";
          drv = derivation (
            toDrvAttrs (removeAttrs finalAttrs [ "name" ])
            // {
              inherit name;
              system = buildSystem;
              builder = "/bin/sh";
              args = stubBuilder;
              stubHostPlatform = platform.config;
            }
          );
          finalPackage =
            drv
            // (finalAttrs.passthru or { })
            // {
              meta = finalAttrs.meta or { };
              overrideAttrs = f: extensible (lib.extends (lib.toExtension f) rattrs);
            };
        in
        finalPackage;
    in
    extensible rattrs0;

  fixedOutput =
    {
      name,
      hash ? "",
      sha256 ? "",
      mode,
      passthru ? { },
    }:
    let
      # nixpkgs turns an empty hash into lib.fakeHash (with a warning); do the same.
      h =
        if hash != "" then
          hash
        else if sha256 != "" then
          sha256
        else
          lib.fakeHash;
    in
    derivation (
      {
        inherit name system;
        builder = "/bin/sh";
        args = stubBuilder;
        outputHash = h;
        outputHashMode = mode;
      }
      // lib.optionalAttrs (sha256 != "" && hash == "") { outputHashAlgo = "sha256"; }
    )
    // passthru
    // {
      outputHash = h;
    };

  # fetchgit's getRevWithTag: exactly one of rev/tag; a tag is fetched as refs/tags/<tag>.
  gitRefOf =
    args:
    assert lib.assertMsg (
      (args ? rev) != (args ? tag)
    ) "fetchFromGitHub/fetchFromGitLab: give exactly one of rev or tag (nixpkgs asserts the same)";
    if args ? tag then "refs/tags/${args.tag}" else args.rev;

  mkPkgs =
    final:
    let
      callPackageWith =
        autoArgs: fn: args:
        let
          f = if builtins.isPath fn || lib.isString fn then import fn else fn;
          fargs = lib.functionArgs f;
          given = builtins.intersectAttrs fargs autoArgs // args;
          missing = lib.filter (n: !fargs.${n} && !(given ? ${n})) (lib.attrNames fargs);
        in
        if missing != [ ] then
          throw "stub callPackage: function called without required argument(s) ${lib.concatStringsSep ", " missing} (nixpkgs has no such attribute)"
        else
          lib.makeOverridable f given;

      stdenv = {
        inherit hostPlatform buildPlatform;
        targetPlatform = hostPlatform;
        isDarwin = hostPlatform.isDarwin;
        isLinux = hostPlatform.isLinux;
        mkDerivation = mkDerivationFor hostPlatform;
        cc = leaf "cc-wrapper" { };
      };

      leaf =
        pname: extra:
        mkDerivationFor hostPlatform (
          {
            inherit pname;
            version = "0-stub";
          }
          // extra
        );

      pythonPackages = lib.genAttrs [
        "setuptools"
        "jinja2"
        "pyyaml"
        "platformdirs"
        "huggingface-hub" # provision.model_refs builds hf:// URLs with it
        "requests" # the HTTP adapter
        "argcomplete" # provision completion
        "pytest"
      ] (n: leaf "python3-${n}" { });
    in
    {
      inherit lib stdenv config;
      inherit (final.stdenv) hostPlatform buildPlatform;
      callPackage = callPackageWith final;
      newScope = extra: callPackageWith (final // extra);
      stdenvNoCC = stdenv;

      buildPackages = final;
      pkgsBuildHost = final;
      pkgsCross.aarch64-multiplatform = import ./default.nix {
        localSystem = buildSystem;
        crossSystem.config = "aarch64-unknown-linux-gnu";
        inherit config;
      };
      pkgsStatic = import ./default.nix {
        localSystem = buildSystem;
        crossSystem.config =
          if hostConfig == null then
            "${hostPlatform.config}"
          else
            builtins.replaceStrings [ "-gnu" ] [ "-musl" ] hostConfig;
        isStatic = true;
        inherit config;
      };

      # fetchers
      fetchurl =
        {
          url,
          hash ? "",
          sha256 ? "",
          name ? lib.last (lib.splitString "/" url),
          ...
        }:
        fixedOutput {
          inherit name hash sha256;
          mode = "flat";
          passthru = {
            inherit url;
          };
        };
      fetchFromGitHub =
        {
          owner,
          repo,
          hash ? "",
          sha256 ? "",
          name ? "source",
          ...
        }@args:
        fixedOutput {
          inherit name hash sha256;
          mode = "recursive";
          passthru = {
            inherit owner repo;
            rev = gitRefOf args;
            tag = args.tag or null;
          };
        };
      fetchFromGitLab =
        {
          owner,
          repo,
          domain ? "gitlab.com",
          hash ? "",
          sha256 ? "",
          name ? "source",
          ...
        }@args:
        fixedOutput {
          inherit name hash sha256;
          mode = "recursive";
          passthru = {
            inherit owner repo domain;
            rev = gitRefOf args;
            tag = args.tag or null;
          };
        };
      fetchPypi =
        {
          pname,
          version,
          hash ? "",
          ...
        }:
        fixedOutput {
          name = "${pname}-${version}.tar.gz";
          inherit hash;
          mode = "flat";
          passthru = {
            inherit pname version;
          };
        };

      rustPlatform = {
        fetchCargoVendor =
          {
            hash ? "",
            sha256 ? "",
            name ? "cargo-deps-vendor",
            src ? null,
            ...
          }@args:
          fixedOutput {
            name =
              if args ? pname && args ? version then "${args.pname}-${args.version}-vendor" else name;
            inherit hash sha256;
            mode = "recursive";
            passthru = {
              inherit src;
            };
          };
        cargoSetupHook = leaf "cargo-setup-hook" { };
        bindgenHook = leaf "rust-bindgen-hook" { };
      };

      # trivial builders
      runCommandWith =
        {
          name,
          derivationArgs ? { },
          ...
        }:
        buildCommand:
        stdenv.mkDerivation ({ inherit name buildCommand; } // derivationArgs);
      runCommand =
        name: env: buildCommand:
        stdenv.mkDerivation ({ inherit name buildCommand; } // env);
      runCommandCC = final.runCommand;
      writeText =
        name: text:
        stdenv.mkDerivation {
          inherit name text;
        };
      writeShellScriptBin =
        name: text:
        stdenv.mkDerivation {
          inherit name;
          text = "#!${final.runtimeShell}\n" + text;
          meta.mainProgram = name;
        };
      runtimeShell = "${final.bash}/bin/bash";
      symlinkJoin =
        {
          name,
          paths,
          postBuild ? "",
          ...
        }@args:
        stdenv.mkDerivation (
          removeAttrs args [ "paths" ]
          // {
            inherit name postBuild;
            paths = paths;
            passAsFile = [ "paths" ];
          }
        );
      mkShell =
        {
          packages ? [ ],
          nativeBuildInputs ? [ ],
          ...
        }@args:
        stdenv.mkDerivation (
          removeAttrs args [ "packages" ]
          // {
            name = args.name or "nix-shell";
            nativeBuildInputs = packages ++ nativeBuildInputs;
          }
        );

      # tools and libraries, by their nixpkgs attribute names
      bash = leaf "bash" { };
      makeWrapper = leaf "make-shell-wrapper-hook" { };
      fixDarwinDylibNames = leaf "fix-darwin-dylib-names-hook" { };
      autoAddDriverRunpath = leaf "auto-add-driver-runpath-hook" { };
      nix-update-script = _: [ "nix-update" ];
      gitUpdater = _: [ "git-updater" ];
      cargo = leaf "cargo" { };
      rustc = leaf "rustc" { };
      pkg-config = leaf "pkg-config-wrapper" { };
      meson = leaf "meson" { };
      ninja = leaf "ninja" { };
      cmake = leaf "cmake" { };
      shaderc = leaf "shaderc" { };
      spirv-headers = leaf "spirv-headers" { };
      vulkan-headers = leaf "vulkan-headers" { };
      vulkan-loader = leaf "vulkan-loader" { };
      libepoxy = leaf "libepoxy" { };
      libGLU = leaf "libGLU" { };
      libX11 = leaf "libX11" { };
      libva = leaf "libva" { };
      mesa = leaf "mesa" { };
      apple-sdk_15 = leaf "apple-sdk" { };
      cereal = leaf "cereal" { };
      glslang = leaf "glslang" { };
      spirv-cross = leaf "spirv-cross" { };
      spirv-tools = leaf "spirv-tools" { };
      xcbuildHook = leaf "xcbuild-hook" { };
      libdrm = leaf "libdrm" { };
      libgbm = leaf "libgbm" { };
      libkrunfw = leaf "libkrunfw" { };
      rutabaga_gfx = leaf "rutabaga-gfx" { };
      pipewire = leaf "pipewire" { };
      openssl = leaf "openssl" { };
      glibc = leaf "glibc" { } // {
        static = leaf "glibc-static" { };
      };
      darwin.sigtool = leaf "sigtool" { };
      nixfmt-tree = leaf "nixfmt-tree" { meta.mainProgram = "treefmt"; };
      moltenvk = final.callPackage (fromFacts "moltenvk" (import ./pkgs/moltenvk.nix)) { };

      python3 = leaf "python3" { } // {
        pkgs = final.python3Packages;
        withPackages = f: leaf "python3-env" { propagatedBuildInputs = f final.python3Packages; };
      };
      python3Packages = pythonPackages // {
        inherit (final) fetchPypi;
        buildPythonApplication =
          {
            pyproject ? null,
            build-system ? [ ],
            dependencies ? [ ],
            ...
          }@args:
          assert lib.assertMsg (pyproject != null) "buildPythonApplication: set pyproject = true (nixpkgs requires it)";
          stdenv.mkDerivation (
            removeAttrs args [
              "pyproject"
              "build-system"
              "dependencies"
            ]
            // {
              pname = "python3-${args.pname}";
              nativeBuildInputs = build-system ++ (args.nativeBuildInputs or [ ]);
              propagatedBuildInputs = dependencies;
              inherit pyproject;
            }
          );
      };

      cudaPackages = {
        backendStdenv = stdenv;
        cuda_nvcc = leaf "cuda_nvcc" { };
        cuda_cudart = leaf "cuda_cudart" { };
        cccl = leaf "cuda_cccl" { };
        libcublas = leaf "libcublas" { };
        flags.cmakeCudaArchitecturesString = "75;80;86;89;90";
      };

      # nixpkgs packages krun-gpu calls or overrides, with the argument sets of facts.json
      virglrenderer = final.callPackage (fromFacts "virglrenderer" (import ./pkgs/virglrenderer.nix)) { };
      libkrun = final.callPackage (fromFacts "libkrun" (import ./pkgs/libkrun.nix)) { };
      libkrun-efi = final.callPackage (fromFacts "libkrun-efi" (import ./pkgs/libkrun-efi.nix)) { };
      krunkit = final.callPackage (fromFacts "krunkit" (import ./pkgs/krunkit.nix)) { };
    };

  configDefaults = {
    cudaSupport = false;
    rocmSupport = false;
    allowUnfree = false;
  };
  toOverlay = lib.composeManyExtensions overlays;
  pkgs = lib.fix (lib.extends toOverlay (final: mkPkgs final // { config = configDefaults // config; }));
in
pkgs
