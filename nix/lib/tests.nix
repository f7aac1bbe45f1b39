# Unit tests of nix/lib in lib.runTests form ({ testX = { expr; expected; }; }); evaluates to the
# list of failures, [] when everything passes. Also usable with nix-unit.
#   nix-instantiate --eval --strict --json nix/lib/tests.nix \
#     --arg lib 'import ./nix/tests/stub-nixpkgs/lib.nix'
{ lib }:
let
  k = import ./. { inherit lib; };
  vr = k.virglrenderer;
  # tryEval stops at weak head normal form; force the whole value so a throw inside a list counts.
  failsWith = expr: !(builtins.tryEval (builtins.deepSeq expr expr)).success;

  fakeFetchers = {
    fetchFromGitHub = args: { fetcher = "github"; } // args;
    fetchFromGitLab = args: { fetcher = "gitlab"; } // args;
    fetchurl = args: { fetcher = "url"; } // args;
    fetchPypi = args: { fetcher = "pypi"; } // args;
  };
  pinsJson = builtins.toJSON {
    sources = {
      good = {
        fetcher = "fetchFromGitHub";
        owner = "o";
        repo = "r";
        rev = "0123456789012345678901234567890123456789";
        tag = "v1";
        hash = "sha256-x";
        status = "READ";
      };
      tagged = {
        fetcher = "fetchFromGitHub";
        owner = "o";
        repo = "r";
        tag = "v2";
        hash = "sha256-y";
        status = "VERIFIED";
      };
      doubtful = {
        fetcher = "fetchurl";
        url = "https://example.invalid/x.tar.gz";
        hash = "sha256-z";
        status = "UNVERIFIED";
        provenance = "nobody checked";
      };
      odd = {
        fetcher = "fetchurl";
        url = "https://example.invalid/y.tar.gz";
        hash = "sha256-z";
        status = "MAYBE";
      };
    };
    nixpkgs = {
      rev = "r";
      status = "READ";
    };
  };
  pins = k.pins.fromText "pins.json" pinsJson;
in
lib.runTests {
  # virglrenderer: each series gets only the options its meson_options.txt declares.
  testVenusFork0104 = {
    expr = vr.mesonFlags {
      version = "0.10.4";
      venus = true;
      renderServer = false;
      drm = false;
    };
    expected = [
      "-Dvenus=true"
      "-Drender-server=false"
      "-Ddrm=disabled"
    ];
  };
  testApirMr1590Is120WithoutDrmOrRenderServer = {
    expr = vr.mesonFlags {
      version = "1.2.0";
      venus = true;
      apir = true;
      drm = false;
      renderServer = false;
    };
    expected = [
      "-Dvenus=true"
      "-Dapir=true"
    ];
  };
  testApir130DarwinDlopensMoltenVK = {
    expr = vr.mesonFlags {
      version = "1.3.0";
      apir = true;
      vulkanDload = true;
    };
    expected = [
      "-Dvenus=true"
      "-Dapir=true"
      "-Dvulkan-dload=true"
    ];
  };
  testMoltenvkDlopenRuleQuotesTheStorePath = {
    expr = vr.moltenvkDlopenRule "/nix/store/x-moltenvk/lib/libMoltenVK.dylib";
    expected = {
      file = "src/venus/vkr_library.c";
      from = ''"libMoltenVK.dylib"'';
      to = ''"/nix/store/x-moltenvk/lib/libMoltenVK.dylib"'';
    };
  };
  testNoApirFlagOnTheVenusFork = {
    expr = builtins.any (lib.hasPrefix "-Dapir") (vr.mesonFlags { version = "0.10.4"; });
    expected = false;
  };
  testApirOnTheVenusForkIsRefused = {
    expr = failsWith (vr.mesonFlags {
      version = "0.10.4";
      apir = true;
    });
    expected = true;
  };
  testDrmOn12IsRefused = {
    expr = failsWith (vr.mesonFlags {
      version = "1.2.0";
      drm = true;
    });
    expected = true;
  };
  testVulkanDloadOn0104IsRefused = {
    expr = failsWith (vr.mesonFlags {
      version = "0.10.4";
      vulkanDload = false;
    });
    expected = true;
  };
  testUnknownSeriesIsRefused = {
    expr = failsWith (vr.mesonFlags { version = "1.1.1"; });
    expected = true;
  };
  testSeriesBoundaries = {
    expr = map (v: (vr.series v).name) [
      "0.10.4"
      "1.2.0"
      "1.2.99"
      "1.3.0"
    ];
    expected = [
      "0.10"
      "1.2"
      "1.2"
      "1.3"
    ];
  };

  # ggml
  testGgmlMetalFlags = {
    expr = k.ggml.cmakeFlags "metal";
    expected = [
      "-DGGML_VIRTGPU:BOOL=TRUE"
      "-DGGML_VIRTGPU_BACKEND=ONLY"
      "-DGGML_CUDA:BOOL=FALSE"
      "-DGGML_METAL:BOOL=TRUE"
      "-DGGML_VULKAN:BOOL=FALSE"
      "-DGGML_METAL_EMBED_LIBRARY:BOOL=TRUE"
      "-DBUILD_SHARED_LIBS:BOOL=TRUE"
      "-DGGML_NATIVE:BOOL=FALSE"
      "-DLLAMA_BUILD_TESTS:BOOL=FALSE"
      "-DLLAMA_BUILD_EXAMPLES:BOOL=FALSE"
      "-DLLAMA_BUILD_TOOLS:BOOL=FALSE"
      "-DLLAMA_BUILD_SERVER:BOOL=FALSE"
      "-DLLAMA_OPENSSL:BOOL=FALSE"
      "-DGGML_BLAS:BOOL=FALSE"
      "-DLLAMA_BUILD_COMMON:BOOL=FALSE"
      "-DLLAMA_BUILD_APP:BOOL=FALSE"
    ];
  };
  testGgmlVulkanTurnsOnlyVulkanOn = {
    expr = lib.filter (lib.hasSuffix ":BOOL=TRUE") (k.ggml.cmakeFlags "vulkan");
    expected = [
      "-DGGML_VIRTGPU:BOOL=TRUE"
      "-DGGML_VULKAN:BOOL=TRUE"
      "-DBUILD_SHARED_LIBS:BOOL=TRUE"
    ];
  };
  testGgmlCudaTargets = {
    expr = k.ggml.buildTargets "cuda";
    expected = [
      "ggml-virtgpu-backend"
      "ggml-cuda"
    ];
  };
  testGgmlLibrariesMetal = {
    expr = k.ggml.libraries "metal";
    expected = [
      "ggml-base"
      "ggml-virtgpu-backend"
      "ggml-metal"
    ];
  };
  testPickBackendNeedsExactlyOne = {
    expr = [
      (failsWith (k.ggml.pickBackend {
        metalSupport = true;
        vulkanSupport = false;
        cudaSupport = true;
      }))
      (failsWith (k.ggml.pickBackend {
        metalSupport = false;
        vulkanSupport = false;
        cudaSupport = false;
      }))
      (k.ggml.pickBackend {
        metalSupport = false;
        vulkanSupport = false;
        cudaSupport = true;
      })
    ];
    expected = [
      true
      true
      "cuda"
    ];
  };
  testRuntimeEnvMetal = {
    expr = k.ggml.runtimeEnv {
      name = "metal";
      package = "/nix/store/x-ggml";
      sharedLibrary = ".dylib";
    };
    expected = {
      VIRGL_APIR_BACKEND_LIBRARY = "/nix/store/x-ggml/lib/libggml-virtgpu-backend.dylib";
      APIR_LLAMA_CPP_GGML_LIBRARY_PATH = "/nix/store/x-ggml/lib/libggml-metal.dylib";
      APIR_LLAMA_CPP_GGML_LIBRARY_REG = "ggml_backend_metal_reg";
    };
  };
  testRuntimeEnvVulkanReg = {
    expr =
      (k.ggml.runtimeEnv {
        name = "vulkan";
        package = "/p";
        sharedLibrary = ".so";
      }).APIR_LLAMA_CPP_GGML_LIBRARY_REG;
    expected = "ggml_backend_vk_reg";
  };
  testUnknownBackendIsRefused = {
    expr = failsWith (k.ggml.cmakeFlags "opencl");
    expected = true;
  };

  # libkrun
  testLibkrunForKrunkit = {
    expr = k.libkrun.makeFlags {
      gpu = true;
      blk = true;
      net = true;
    };
    expected = [
      "BLK=1"
      "NET=1"
      "GPU=1"
    ];
  };
  testLibkrunDefaultsOff = {
    expr = k.libkrun.makeFlags { };
    expected = [ ];
  };

  # pins
  testPinFetchedByRevWhenItHasOne = {
    expr = k.pins.fetch fakeFetchers "good" (pins.source "good");
    expected = {
      fetcher = "github";
      owner = "o";
      repo = "r";
      rev = "0123456789012345678901234567890123456789";
      hash = "sha256-x";
    };
  };
  testPinFetchedByTagOtherwise = {
    expr = (k.pins.fetch fakeFetchers "tagged" (pins.source "tagged")).tag;
    expected = "v2";
  };
  testUnverifiedPinThrows = {
    expr = failsWith (pins.source "doubtful");
    expected = true;
  };
  testUnknownStatusThrows = {
    expr = failsWith (pins.source "odd");
    expected = true;
  };
  testMissingPinThrows = {
    expr = failsWith (pins.source "nope");
    expected = true;
  };
  testNixpkgsPinReadable = {
    expr = pins.nixpkgs.rev;
    expected = "r";
  };
  testNixpkgsPackageOfThePinnedVersionIsTaken = {
    expr = (k.pins.sameVersion "moltenvk" { version = "1.4.1"; } { version = "1.4.1"; }).version;
    expected = "1.4.1";
  };
  testNixpkgsPackageOfAnotherVersionIsRefused = {
    expr = failsWith (k.pins.sameVersion "moltenvk" { version = "1.4.1"; } { version = "1.4.2"; }).version;
    expected = true;
  };

  # krunkit <-> libkrun pairing
  testKrunkitLibkrunPairs = {
    expr =
      let
        rules = [
          {
            krunkit = "1.3";
            libkrun_min = "1.19.3";
            libkrun_below = "2.0";
          }
        ];
        ok = a: b: !(failsWith (k.compat.checkKrunkitLibkrun rules a b));
      in
      [
        (ok "1.3.2" "1.19.3")
        (ok "1.3.2" "1.19.0")
        (ok "1.3.2" "2.0.0")
        (ok "1.2.1" "1.19.0")
      ];
    expected = [
      true
      false
      false
      true
    ];
  };

  # python
  testRequirementNames = {
    expr = map k.python.requirementName [
      "jinja2>=3.1"
      "PyYAML>=6.0"
      "typing_extensions ; python_version<'3.12'"
      "zope.interface[test]==6"
    ];
    expected = [
      "jinja2"
      "pyyaml"
      "typing-extensions"
      "zope-interface"
    ];
  };
}
