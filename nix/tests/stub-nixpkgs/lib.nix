# TEST DOUBLE of nixpkgs' `lib` for the krun-gpu flake tests (Debian's nix 2.8 cannot evaluate real
# nixpkgs, which needs nix >= 2.18). Only the functions the flake uses, with nixpkgs' real names,
# argument order and output formats, written against these files of NixOS/nixpkgs:
#   lib/strings.nix       mesonOption/mesonBool/mesonEnable ("-Dx=true", "-Dx=disabled"),
#                         cmakeOptionType/cmakeBool/cmakeFeature ("-DX:BOOL=TRUE", "-DX:STRING=v"),
#                         versionOlder/versionAtLeast, escapeShellArg, toUpper, makeBinPath
#   lib/customisation.nix makeOverridable (.override keeps working after .overrideAttrs)
#   lib/fixed-points.nix  fix, extends, toExtension
#   lib/debug.nix         runTests (a list of { name; expected; result; } failures, [] when all pass)
#   lib/trivial.nix       fakeHash, warnIf, boolToString, importJSON/importTOML, setFunctionArgs,
#                         functionArgs/isFunction (functor-aware)
# It is not nixpkgs and builds nothing; see default.nix for the package half.
let
  inherit (builtins)
    attrNames
    concatLists
    concatStringsSep
    elem
    filter
    foldl'
    isAttrs
    isBool
    isList
    isString
    listToAttrs
    mapAttrs
    substring
    ;

  lib = rec {
    inherit
      attrNames
      concatStringsSep
      elem
      filter
      foldl'
      isAttrs
      isBool
      isList
      isString
      mapAttrs
      substring
      ;
    inherit (builtins)
      all
      any
      attrValues
      hasAttr
      head
      length
      tail
      elemAt
      genList
      replaceStrings
      stringLength
      toJSON
      fromJSON
      match
      split
      sort
      typeOf
      intersectAttrs
      removeAttrs
      readFile
      pathExists
      ;

    # trivial.nix: functions with explicit argument sets (setFunctionArgs) count as functions
    setFunctionArgs = f: args: {
      __functor = self: f;
      __functionArgs = args;
    };
    functionArgs =
      f: if f ? __functor then f.__functionArgs or (functionArgs (f.__functor f)) else builtins.functionArgs f;
    isFunction = f: builtins.isFunction f || (f ? __functor && isFunction (f.__functor f));
    id = x: x;
    flip =
      f: a: b:
      f b a;
    boolToString = b: if b then "true" else "false";
    warn = msg: builtins.trace "evaluation warning: ${msg}";
    warnIf = cond: msg: if cond then warn msg else id;
    throwIf = cond: msg: if cond then throw msg else id;
    assertMsg = pred: msg: pred || throw msg;
    importJSON = path: builtins.fromJSON (builtins.readFile path);
    importTOML = path: builtins.fromTOML (builtins.readFile path);
    fakeHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    fakeSha256 = "0000000000000000000000000000000000000000000000000000";
    toList = x: if isList x then x else [ x ];
    last = l: builtins.elemAt l (builtins.length l - 1);
    toUpper = replaceStrings lowerChars upperChars;
    toLower = replaceStrings upperChars lowerChars;
    lowerChars = stringToCharacters "abcdefghijklmnopqrstuvwxyz";
    upperChars = stringToCharacters "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    stringToCharacters = s: builtins.genList (p: substring p 1 s) (builtins.stringLength s);

    # lists.nix / attrsets.nix
    optional = cond: elem: if cond then [ elem ] else [ ];
    optionals = cond: elems: if cond then elems else [ ];
    optionalString = cond: s: if cond then s else "";
    optionalAttrs = cond: as: if cond then as else { };
    concatMap = f: l: concatLists (map f l);
    concatMapStrings = f: l: concatStringsSep "" (map f l);
    concatMapStringsSep =
      sep: f: l:
      concatStringsSep sep (map f l);
    concatLists = builtins.concatLists;
    unique = foldl' (acc: e: if elem e acc then acc else acc ++ [ e ]) [ ];
    subtractLists = e: filter (x: !(elem x e));
    genAttrs =
      names: f:
      listToAttrs (
        map (n: {
          name = n;
          value = f n;
        }) names
      );
    nameValuePair = name: value: { inherit name value; };
    mapAttrsToList = f: attrs: map (n: f n attrs.${n}) (attrNames attrs);
    mapAttrs' = f: attrs: listToAttrs (mapAttrsToList f attrs);
    concatMapAttrs = f: attrs: foldl' (acc: x: acc // x) { } (mapAttrsToList f attrs);
    filterAttrs =
      pred: set:
      listToAttrs (
        concatMap (
          n:
          let
            v = set.${n};
          in
          if pred n v then [ (nameValuePair n v) ] else [ ]
        ) (attrNames set)
      );
    recursiveUpdate = a: b: a // mapAttrs (n: v: if isAttrs v && isAttrs (a.${n} or null) then recursiveUpdate a.${n} v else v) b;
    hasPrefix = pref: str: substring 0 (builtins.stringLength pref) str == pref;
    removePrefix =
      pref: str:
      if hasPrefix pref str then
        substring (builtins.stringLength pref) (builtins.stringLength str - builtins.stringLength pref) str
      else
        str;
    hasSuffix =
      suffix: content:
      let
        lc = builtins.stringLength content;
        ls = builtins.stringLength suffix;
      in
      lc >= ls && substring (lc - ls) lc content == suffix;
    hasInfix = infix: content: builtins.match ".*${escapeRegex infix}.*" content != null;
    escapeRegex = escape (stringToCharacters "\\[{()^$?*+|.");
    escape = list: replaceStrings list (map (c: "\\${c}") list);
    splitString = sep: s: filter isString (builtins.split (escapeRegex sep) s);

    # strings.nix: shell quoting and the build-system flag formats
    escapeShellArg =
      arg:
      let
        s = toString arg;
      in
      if builtins.match "[[:alnum:],._+:@%/-]+" s == null then "'${replaceStrings [ "'" ] [ "'\\''" ] s}'" else s;
    escapeShellArgs = concatMapStringsSep " " escapeShellArg;
    makeSearchPath = sub: paths: concatStringsSep ":" (map (p: "${p}/${sub}") paths);
    makeBinPath = makeSearchPath "bin";
    makeLibraryPath = makeSearchPath "lib";
    versionOlder = v1: v2: builtins.compareVersions v2 v1 == 1;
    versionAtLeast = v1: v2: !versionOlder v1 v2;
    getName = x: if isString x then (builtins.parseDrvName x).name else x.pname or (builtins.parseDrvName x.name).name;
    getVersion = x: if isString x then (builtins.parseDrvName x).version else x.version or (builtins.parseDrvName x.name).version;
    mesonOption =
      feature: value:
      assert isString feature;
      assert isString value;
      "-D${feature}=${value}";
    mesonBool =
      condition: flag:
      assert isString condition;
      assert isBool flag;
      mesonOption condition (boolToString flag);
    mesonEnable =
      feature: flag:
      assert isString feature;
      assert isBool flag;
      mesonOption feature (if flag then "enabled" else "disabled");
    cmakeOptionType =
      type: feature: value:
      assert elem (toUpper type) [
        "BOOL"
        "FILEPATH"
        "PATH"
        "STRING"
        "INTERNAL"
        "LIST"
      ];
      assert isString feature;
      assert isString value;
      "-D${feature}:${toUpper type}=${value}";
    cmakeBool =
      condition: flag:
      assert isString condition;
      assert isBool flag;
      cmakeOptionType "bool" condition (toUpper (boolToString flag));
    cmakeFeature =
      feature: value:
      assert isString feature;
      assert isString value;
      cmakeOptionType "string" feature value;

    # fixed-points.nix
    fix =
      f:
      let
        x = f x;
      in
      x;
    extends =
      overlay: f: final:
      let
        prev = f final;
      in
      prev // overlay final prev;
    toExtension =
      f:
      if isFunction f then
        final: prev:
        let
          fPrev = f prev;
        in
        if isFunction fPrev then f final prev else fPrev
      else
        final: prev: f;
    composeManyExtensions = foldl' (
      f: g: final: prev:
      let
        fApplied = f final prev;
        prev' = prev // fApplied;
      in
      fApplied // g final prev'
    ) (final: prev: { });

    # customisation.nix: the result of callPackage can be re-called with other arguments
    # (.override) and keeps that ability after .overrideAttrs.
    makeOverridable =
      f: origArgs:
      let
        result = f origArgs;
        merge = newArgs: origArgs // (if isFunction newArgs then newArgs origArgs else newArgs);
        overrideResult = g: makeOverridable (args: g (f args)) origArgs;
      in
      if isAttrs result then
        result
        // {
          override = newArgs: makeOverridable f (merge newArgs);
        }
        // optionalAttrs (result ? overrideAttrs) {
          overrideAttrs = fdrv: overrideResult (x: x.overrideAttrs fdrv);
        }
      else if isFunction result then
        result
      else
        result;

    # debug.nix
    runTests =
      tests:
      concatLists (
        map (
          name:
          let
            test = tests.${name};
          in
          if substring 0 4 name == "test" && test.expr != test.expected then
            [
              {
                inherit name;
                inherit (test) expected;
                result = test.expr;
              }
            ]
          else
            [ ]
        ) (attrNames tests)
      );

    # meta.nix / platforms / licenses: the values packages put in `meta`
    platforms = rec {
      darwin = [
        "aarch64-darwin"
        "x86_64-darwin"
      ];
      linux = [
        "aarch64-linux"
        "x86_64-linux"
      ];
      unix = darwin ++ linux;
    };
    licenses = {
      mit = {
        spdxId = "MIT";
        free = true;
      };
      asl20 = {
        spdxId = "Apache-2.0";
        free = true;
      };
    };
    maintainers = { };
    systems.flakeExposed = [
      "x86_64-linux"
      "aarch64-linux"
      "x86_64-darwin"
      "aarch64-darwin"
    ];
  };
in
lib
