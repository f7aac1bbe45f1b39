# krun-gpu: host libraries and tools that let llama.cpp in a Linux VM/container use the host GPU
# (Venus and API Remoting), plus the `provision` CLI. Install the host bundle with
#   nix profile add .#krun        (Nix >= 2.30; `nix profile install .#krun` before that)
# The only input is nixpkgs. flake.lock's revision and narHash were read from a public lock file
# (provenance: provision/data/pins.json, key "nixpkgs"); tests check that the two agree.
# Every other version, rev and hash comes from provision/data/pins.json. docs/nix.md has the rest.
{
  description = "krun-gpu: GPU llama.cpp in krunkit/QEMU guests (virglrenderer APIR/Venus, libkrun, krunkit, ggml-virtgpu-backend)";

  inputs.nixpkgs.url = "github:nixos/nixpkgs/nixpkgs-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;

      # aarch64-darwin first: krunkit, Metal and MoltenVK exist only there.
      systems = [
        "aarch64-darwin"
        "x86_64-linux"
        "aarch64-linux"
      ];

      forAllSystems = f: lib.genAttrs systems (system: f (pkgsFor system));

      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          overlays = [ self.overlays.default ];
        };

      krunLib = import ./nix/lib { inherit lib; };

      packagesOf =
        pkgs:
        let
          common = {
            inherit (pkgs) virglrenderer-apir ggml-virtgpu-backend krun;
            libkrun = pkgs.libkrun-gpu;
            provision = pkgs.krun-provision;
            default = pkgs.krun;
          };
          darwinOnly = {
            inherit (pkgs) virglrenderer-venus krun-apir;
            moltenvk = pkgs.krun-moltenvk;
            krunkit = pkgs.krunkit-gpu;
            # the APIR route's own libkrun/krunkit pair (virglrenderer-apir); .#krun is Venus
            libkrun-apir = pkgs.libkrun-gpu-apir;
            krunkit-apir = pkgs.krunkit-gpu-apir;
          };
        in
        common // lib.optionalAttrs pkgs.stdenv.hostPlatform.isDarwin darwinOnly;

      app = drv: exe: {
        type = "app";
        program = "${drv}/bin/${exe}";
      };

      # The pure helpers' unit tests run while the flake is evaluated: a failure list that is not
      # empty makes this check (and so `nix flake check`) fail with the list in the message.
      libTests =
        pkgs:
        let
          failures = import ./nix/lib/tests.nix { inherit lib; };
        in
        if failures == [ ] then
          pkgs.runCommand "krun-gpu-lib-tests" { } "touch $out"
        else
          throw "krun-gpu: nix/lib tests failed: ${builtins.toJSON failures}";

      testsOf =
        name: pkg:
        lib.mapAttrs' (test: drv: lib.nameValuePair "${name}-${test}" drv) (
          lib.filterAttrs (_: lib.isAttrs) (pkg.passthru.tests or pkg.tests or { })
        );
    in
    {
      overlays.default = import ./nix/overlay.nix;

      lib = krunLib;

      packages = forAllSystems packagesOf;

      # CUDA needs unfree packages; reachable for issue-style overrides without entering
      # `nix flake check`: nix build --impure .#legacyPackages.x86_64-linux.ggml-virtgpu-backend-cuda
      legacyPackages = forAllSystems (
        pkgs:
        lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
          ggml-virtgpu-backend-cuda = pkgs.ggml-virtgpu-backend.override { cudaSupport = true; };
        }
      );

      apps = forAllSystems (
        pkgs:
        {
          krun-env = app pkgs.krun.krun-env "krun-env";
          provision = app pkgs.krun-provision "provision";
          default = app pkgs.krun.krun-env "krun-env";
        }
        // lib.optionalAttrs pkgs.stdenv.hostPlatform.isDarwin {
          # krunkit of the Venus bundle; krunkit-apir is the APIR bundle's, wrapped with its defaults.
          krunkit = app pkgs.krun "krunkit";
          krunkit-apir = app pkgs.krun-apir "krunkit";
          default = app pkgs.krun "krunkit";
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (
              ps: map (req: ps.${krunLib.python.requirementName req}) (lib.importTOML ./pyproject.toml).project.dependencies
            ))
            pkgs.cmake
            pkgs.ninja
            pkgs.pkg-config
            pkgs.nixfmt-tree
          ];
        };
      });

      checks = forAllSystems (
        pkgs:
        let
          packages = packagesOf pkgs;
        in
        removeAttrs packages [ "default" ]
        // lib.concatMapAttrs testsOf (removeAttrs packages [ "default" ])
        // {
          lib-tests = libTests pkgs;
        }
      );

      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree);
    };
}
