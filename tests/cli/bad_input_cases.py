"""The bad-input table: what a careless or hostile user types, and the one answer each deserves.

Each case runs in a sandbox (tests/cli/test_bad_input.py): a working directory holding files the
user cares about, a model store with tiny-llama in it, a state directory and, for pulls, a
fault HTTP server on 127.0.0.1 (tests/models/models_http.py). ``code`` is the expected error code, or
"ok" for an input that must succeed safely (a damaged ref listed, a damaged blob repaired).
``changes`` are globs (relative to the sandbox) of the only files the command may change;
store lock files may always appear. ``defect`` names the issue #13 finding the case pins down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Findings listed in issue #13; every one needs at least one case (tests/test_bad_input.py checks).
DEFECTS = (
    "synth-output-overwrites",
    "synth-output-ulimit",
    "render-output-empty",
    "render-output-existing-file",
    "catalog-name-rebind",
    "sha256-empty",
    "hf-endpoint-policy",
    "launch-machine-injection",
    "launch-machine-path",
    "pull-ignore-range-loop",
    "pull-206-from-zero-loop",
    "pull-never-answers",
    "url-bad-port",
    "url-bad-ipv6",
    "hf-dotdot",
    "ref-not-utf8",
    "cache-is-file",
    "cache-read-only",
    "no-fix-line",
)

COMMANDS = ("stacks", "image", "model", "host-tools", "launch", "run", "bench", "perplexity", "serve", "completion",
            "doctor", "ggml", "apir")  # fmt: skip
SHA_OTHER = "ab" * 32  # a well-formed hash of nothing we serve
FAST = {"PROVISION_STALL_S": "0.3"}
PARTIAL = ("cache/models/partial/*",)  # kept on purpose after E012: the next pull resumes
STORED = ("cache/models/blobs/*", "cache/models/refs/*")
BROKEN_REF = ("cache/models/refs/broken.json",)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: str  # "E0NN", or "ok"
    env: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()  # sandbox preparations, by name (tests/cli/test_bad_input.py SETUPS)
    plans: tuple[str, ...] = ()  # fault server plans, one per request; "{url}"/"{base}" in argv/env
    changes: tuple[str, ...] = ()
    runner: str = "inprocess"  # or "subprocess", "ulimit", "readonly"
    out: str | None = None  # text stdout (or stderr, for "ok") must hold
    json: bool = False  # stdout must be a JSON error with this code
    defect: str | None = None

    @property
    def command(self) -> str:
        """The command the case belongs to: `model pull`, `launch`, or `(top level)`."""
        if not self.argv or self.argv[0] not in COMMANDS:
            return "(top level)"
        if self.argv[0] in ("model", "image") and len(self.argv) > 1 and not self.argv[1].startswith("-"):
            return " ".join(self.argv[:2])
        return self.argv[0]


def c(id: str, code: str, *argv: str, **kw: object) -> Case:  # noqa: A002 - the table reads better
    return Case(id, tuple(argv), code, **kw)  # type: ignore[arg-type]


CASES: tuple[Case, ...] = (
    # --- top level and argument errors -------------------------------------------------------
    c("no-command", "E003", defect="no-fix-line"),
    c("unknown-command", "E003", "bogus"),
    c("unknown-option", "E003", "--bogus"),
    c("arg-error-as-json", "E003", "model", "pull", "--json", json=True),
    # --- stacks -----------------------------------------------------------------------------
    c("stacks-extra-arg", "E003", "stacks", "extra"),
    c("stacks-bad-flag", "E003", "stacks", "--bogus"),
    # --- image render -----------------------------------------------------------------------
    c("render-unknown-stack", "E001", "image", "render", "no-such-stack"),
    c("render-stack-newline", "E001", "image", "render", "cpu\nrm -rf /"),
    c("render-no-stack", "E003", "image", "render"),
    c("render-output-empty", "E003", "image", "render", "cpu", "--output", "", defect="render-output-empty"),
    c("render-output-blank", "E003", "image", "render", "cpu", "--output", "  "),
    c("render-output-newline", "E003", "image", "render", "cpu", "--output", "a\nb"),
    c("render-output-is-file", "E003", "image", "render", "cpu", "--output", "work/notes.txt",
      defect="render-output-existing-file"),
    c("render-output-foreign-containerfile", "E003", "image", "render", "cpu", "--output", "work"),
    c("render-output-foreign-json", "E003", "image", "render", "cpu", "--output", "work", "--json"),
    c("render-catalog-broken-yaml", "E002", "image", "render", "cpu", "--catalog", "work/broken.yaml",
      setup=("broken_catalog",)),
    c("render-catalog-missing", "E002", "image", "render", "cpu", "--catalog", "work/none.yaml"),
    c("render-catalog-not-utf8", "E002", "image", "render", "cpu", "--catalog", "work/binary.yaml",
      setup=("binary_catalog",)),
    c("render-output-fresh-dir", "ok", "image", "render", "cpu", "--output", "work/out",
      changes=("work/out/Containerfile*",)),
    c("render-output-ours-replaced", "ok", "image", "render", "cpu", "--output", "work/ours",
      setup=("our_render",), changes=("work/ours/Containerfile*",)),
    c("render-output-force", "ok", "image", "render", "cpu", "--output", "work", "--force",
      changes=("work/Containerfile*",)),
    # --- image build (every case fails before podman starts) --------------------------------
    c("build-unknown-stack", "E001", "image", "build", "no-such-stack"),
    c("build-tag-spaces", "E003", "image", "build", "cpu", "--tag", "my tag"),
    c("build-tag-newline", "E003", "image", "build", "cpu", "--tag", "x\ny"),
    c("build-tag-upper-semicolon", "E003", "image", "build", "cpu", "--tag", "Repo;rm"),
    c("build-model-dotdot", "E014", "image", "build", "cpu", "--model", "../x"),
    c("build-model-unknown", "E010", "image", "build", "cpu", "--model", "no-such-model"),
    c("build-model-rebound", "E011", "image", "build", "cpu", "--model", "tiny-llama", setup=("rebound_ref",),
      defect="catalog-name-rebind"),
    c("build-base-image-bad", "E003", "image", "build", "cpu", "--base-image", "x;rm -rf /"),
    c("build-catalog-broken", "E002", "image", "build", "cpu", "--catalog", "work/broken.yaml",
      setup=("broken_catalog",)),
    # --- model pull: hashes, names, URLs, refs ----------------------------------------------
    c("pull-sha256-empty", "E003", "model", "pull", "https://127.0.0.1/x.gguf", "--sha256", "",
      defect="sha256-empty"),
    c("pull-sha256-short", "E003", "model", "pull", "https://127.0.0.1/x.gguf", "--sha256", "ab" * 31),
    c("pull-sha256-nonhex", "E003", "model", "pull", "https://127.0.0.1/x.gguf", "--sha256", "zz" * 32),
    c("pull-sha256-spaces", "E003", "model", "pull", "https://127.0.0.1/x.gguf", "--sha256", " "),
    c("pull-catalog-sha-contradicts", "E003", "model", "pull", "tiny-llama", "--sha256", SHA_OTHER),
    c("pull-url-port-99999", "E003", "model", "pull", "http://127.0.0.1:99999/x.gguf", defect="url-bad-port"),
    c("pull-url-port-0", "E003", "model", "pull", "http://127.0.0.1:0/x.gguf"),
    c("pull-url-port-text", "E003", "model", "pull", "http://127.0.0.1:http/x.gguf"),
    c("pull-url-ipv6-open", "E003", "model", "pull", "http://[::1/x.gguf", defect="url-bad-ipv6"),
    c("pull-url-ipv6-garbage", "E003", "model", "pull", "http://[zz::1]/x.gguf"),
    c("pull-url-no-host", "E003", "model", "pull", "https:///x.gguf"),
    c("pull-url-file", "E003", "model", "pull", "file:///etc/passwd"),
    c("pull-url-ftp", "E003", "model", "pull", "ftp://127.0.0.1/x.gguf"),
    c("pull-url-plain-http-remote", "E003", "model", "pull", "http://192.0.2.1/x.gguf"),
    c("pull-url-credentials", "E003", "model", "pull", "https://user:pw@127.0.0.1/x.gguf"),
    c("pull-url-space", "E003", "model", "pull", "https://127.0.0.1/a b.gguf"),
    c("pull-url-newline", "E003", "model", "pull", "https://127.0.0.1/a\nb.gguf"),
    c("pull-url-no-file-name", "E014", "model", "pull", "https://127.0.0.1/"),
    c("pull-url-rebinds-catalog", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", "tiny-llama",
      defect="catalog-name-rebind"),
    c("pull-url-stem-is-catalog", "E014", "model", "pull", "https://127.0.0.1/tiny-llama.gguf"),
    c("pull-url-rebinds-default", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name",
      "qwen2.5-0.5b-instruct-q4_k_m"),
    c("pull-catalog-as-other-catalog", "E014", "model", "pull", "tiny-llama", "--name",
      "qwen2.5-0.5b-instruct-q4_k_m"),
    c("pull-hf-rebinds-catalog", "E014", "model", "pull", "hf://a/b/x.gguf@main", "--name", "tiny-llama",
      env={"HF_ENDPOINT": "http://127.0.0.1:1"}),
    c("pull-hf-dotdot", "E014", "model", "pull", "hf://../../x.gguf", defect="hf-dotdot"),
    c("pull-hf-dotdot-path", "E014", "model", "pull", "hf://a/b/../x.gguf"),
    c("pull-hf-dotdot-rev", "E014", "model", "pull", "hf://a/b/x.gguf@.."),
    c("pull-hf-percent", "E014", "model", "pull", "hf://a/b/x%2f..%2fy.gguf"),
    c("pull-hf-short", "E014", "model", "pull", "hf://a"),
    c("pull-hf-question", "E014", "model", "pull", "hf://a/b/x.gguf?download=1"),
    c("pull-hf-endpoint-plain-remote", "E003", "model", "pull", "hf://a/b/x.gguf@main",
      env={"HF_ENDPOINT": "http://192.0.2.1"}, defect="hf-endpoint-policy"),
    c("pull-hf-endpoint-file", "E003", "model", "pull", "hf://a/b/x.gguf@main", env={"HF_ENDPOINT": "file:///etc"}),
    c("pull-hf-endpoint-bad-ipv6", "E003", "model", "pull", "hf://a/b/x.gguf@main", env={"HF_ENDPOINT": "http://[::1"}),
    c("pull-catalog-hf-endpoint-bad", "E003", "model", "pull", "qwen2.5-0.5b-instruct-q4_k_m",
      env={"HF_ENDPOINT": "ftp://127.0.0.1"}),
    c("pull-name-dotdot", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", "../evil"),
    c("pull-name-slash", "E014", "model", "pull", "a/b"),
    c("pull-name-hidden", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", ".hidden"),
    c("pull-name-newline", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", "a\nb"),
    c("pull-name-too-long", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", "a" * 200),
    c("pull-name-empty", "E014", "model", "pull", "https://127.0.0.1/x.gguf", "--name", ""),
    c("pull-unknown-catalog", "E010", "model", "pull", "no-such-model"),
    c("pull-as-json", "E014", "model", "pull", "../evil", "--json", json=True),
    c("pull-stall-zero", "E003", "model", "pull", "tiny-llama", "--stall-timeout", "0"),
    c("pull-stall-nan", "E003", "model", "pull", "tiny-llama", "--stall-timeout", "nan"),
    c("pull-stall-inf", "E003", "model", "pull", "tiny-llama", "--stall-timeout", "inf"),
    c("pull-stall-negative", "E003", "model", "pull", "tiny-llama", "--stall-timeout", "-1"),
    c("pull-stall-text", "E003", "model", "pull", "tiny-llama", "--stall-timeout", "soon"),
    c("pull-stall-env-text", "E003", "model", "pull", "{url}", env={"PROVISION_STALL_S": "soon"}),
    c("pull-stall-env-zero", "E003", "model", "pull", "{url}", env={"PROVISION_STALL_S": "0"}),
    # --- model pull against the fault server -------------------------------------------------
    c("fault-ignore-range-close-halfway", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("restart_close:{half}",) * 20, env=FAST, changes=PARTIAL, defect="pull-ignore-range-loop"),
    c("fault-206-from-zero", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("from_zero:{half}",) * 20, env=FAST, changes=PARTIAL, defect="pull-206-from-zero-loop"),
    c("fault-wrong-content-range", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("truncate_at:{half}",) + ("wrong_range",) * 20, env=FAST, changes=PARTIAL),
    c("fault-never-answers", "E012", "model", "pull", "{url}", "--sha256", "{sha}", plans=("silent",) * 20,
      env=FAST, changes=PARTIAL, defect="pull-never-answers"),
    c("fault-500s", "E012", "model", "pull", "{url}", "--sha256", "{sha}", plans=("status:500",) * 20,
      env=FAST, changes=PARTIAL),
    c("fault-503-then-429", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("status:503", "status:429") * 10, env=FAST, changes=PARTIAL),
    c("fault-garbage-status-line", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("garbage",) * 20, env=FAST, changes=PARTIAL),
    c("fault-hangup", "E012", "model", "pull", "{url}", "--sha256", "{sha}", plans=("hangup",) * 20,
      env=FAST, changes=PARTIAL),
    c("fault-always-truncated", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("truncate_at:{half}",) * 20, env=FAST, changes=PARTIAL),
    c("fault-404", "E012", "model", "pull", "{base}/missing.gguf", "--sha256", "{sha}", env=FAST),
    c("fault-redirect-plain-remote", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("redirect:http://192.0.2.1/x.gguf",), env=FAST),
    c("fault-redirect-bad-ipv6", "E012", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("redirect:http://[::1/x.gguf",), env=FAST),
    c("fault-huge-length", "E013", "model", "pull", "{url}", plans=("huge_length",), env=FAST),
    c("fault-not-gguf", "E015", "model", "pull", "{base}/page.html", "--name", "page", env=FAST),
    c("fault-hash-mismatch", "E011", "model", "pull", "{url}", "--sha256", SHA_OTHER, env=FAST),
    c("fault-restart-once-then-whole", "ok", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("truncate_at:{half}", "ignore_range"), env=FAST, changes=STORED),
    c("fault-206-from-zero-whole", "ok", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("truncate_at:{half}", "from_zero"), env=FAST, changes=STORED),
    c("fault-slow-drip", "ok", "model", "pull", "{url}", "--sha256", "{sha}", plans=("drip:0.002",), env=FAST,
      changes=STORED, out="done:"),
    c("fault-stall-then-resume", "ok", "model", "pull", "{url}", "--sha256", "{sha}",
      plans=("pause_at:{half}",), env=FAST, changes=STORED, out="stalled"),
    # --- the store: damaged refs and blobs ----------------------------------------------------
    c("list-ref-not-utf8", "ok", "model", "list", setup=("ref_not_utf8",), out="DAMAGED", defect="ref-not-utf8"),
    c("list-ref-bad-json", "ok", "model", "list", "--json", setup=("ref_bad_json",), out='"damaged"'),
    c("list-ref-wrong-fields", "ok", "model", "list", setup=("ref_wrong_fields",), out="DAMAGED"),
    c("list-ref-name-mismatch", "ok", "model", "list", setup=("ref_name_mismatch",), out="DAMAGED"),
    c("list-extra-arg", "E003", "model", "list", "extra"),
    c("rm-ref-not-utf8", "ok", "model", "rm", "broken", setup=("ref_not_utf8",), changes=BROKEN_REF,
      defect="ref-not-utf8"),
    c("rm-ref-bad-json", "ok", "model", "rm", "broken", setup=("ref_bad_json",), changes=BROKEN_REF),
    c("rm-ref-wrong-fields", "ok", "model", "rm", "broken", "--json", setup=("ref_wrong_fields",), changes=BROKEN_REF),
    c("rm-unknown", "E010", "model", "rm", "no-such-model"),
    c("rm-dotdot", "E014", "model", "rm", "x/../../etc"),
    c("rm-empty", "E014", "model", "rm", ""),
    c("path-unknown", "E010", "model", "path", "no-such-model"),
    c("path-dotdot", "E014", "model", "path", ".."),
    c("path-damaged-ref", "E011", "model", "path", "broken", setup=("ref_not_utf8",)),
    c("verify-unknown", "E010", "model", "verify", "no-such-model"),
    c("verify-hidden", "E014", "model", "verify", "..hidden"),
    c("verify-damaged-ref", "E011", "model", "verify", setup=("ref_bad_json",)),
    c("verify-damaged-blob", "E011", "model", "verify", "tiny-llama", setup=("blob_damaged",)),
    c("pull-repairs-damaged-blob", "ok", "model", "pull", "tiny-llama", setup=("blob_damaged",),
      changes=STORED, out="damaged"),
    c("pull-over-damaged-ref", "ok", "model", "pull", "{url}", "--sha256", "{sha}", "--name", "broken",
      setup=("ref_not_utf8",), env=FAST, changes=STORED),
    # --- model synth ---------------------------------------------------------------------------
    c("synth-output-empty", "E003", "model", "synth", "tiny-llama", "--output", ""),
    c("synth-output-existing", "E003", "model", "synth", "tiny-llama", "--output", "work/model.gguf",
      defect="synth-output-overwrites"),
    c("synth-output-dir", "E003", "model", "synth", "tiny-llama", "--output", "work"),
    c("synth-output-missing-parent", "E003", "model", "synth", "tiny-llama", "--output", "work/no/such/x.gguf"),
    c("synth-not-synthetic", "E010", "model", "synth", "qwen2.5-0.5b-instruct-q4_k_m", "--output", "work/q.gguf"),
    c("synth-dotdot", "E014", "model", "synth", "../x"),
    c("synth-no-name", "E003", "model", "synth"),
    c("synth-output-fifo-force", "E003", "model", "synth", "tiny-llama", "--output", "work/pipe", "--force",
      setup=("fifo",)),
    c("synth-output-dev-null-force", "E003", "model", "synth", "tiny-llama", "--output", "/dev/null", "--force"),
    c("render-output-dir-with-fifo", "E003", "image", "render", "cpu", "--output", "work/fifo-dir", "--force",
      setup=("fifo_containerfile",)),
    c("synth-output-force", "ok", "model", "synth", "tiny-llama", "--output", "work/model.gguf", "--force",
      changes=("work/model.gguf",)),
    c("synth-ulimit-existing-force", "E013", "model", "synth", "tiny-llama", "--output", "work/model.gguf",
      "--force", runner="ulimit", defect="synth-output-ulimit"),
    c("synth-ulimit-new-file", "E013", "model", "synth", "tiny-llama", "--output", "work/new.gguf", runner="ulimit"),
    c("synth-ulimit-into-store", "E013", "model", "synth", "tiny-llama", setup=("empty_store",), runner="ulimit"),
    # --- the cache itself ---------------------------------------------------------------------
    c("cache-is-file-list", "E003", "model", "list", setup=("cache_is_file",), defect="cache-is-file"),
    c("cache-is-file-pull", "E003", "model", "pull", "tiny-llama", setup=("cache_is_file",)),
    c("cache-is-file-synth", "E003", "model", "synth", "tiny-llama", setup=("cache_is_file",)),
    c("cache-under-file", "E003", "model", "list", setup=("cache_under_file",)),
    c("cache-read-only-list", "E003", "model", "list", runner="readonly", defect="cache-read-only"),
    c("cache-read-only-synth", "E003", "model", "synth", "tiny-llama", runner="readonly"),
    # --- launch (plans are printed on any OS) -----------------------------------------------
    c("launch-machine-newline", "E003", "launch", "--dry-run", "--machine", "m\necho INJECTED",
      defect="launch-machine-injection"),
    c("launch-machine-dotdot", "E003", "launch", "--dry-run", "--machine", "../../x", defect="launch-machine-path"),
    c("launch-machine-empty", "E003", "launch", "--dry-run", "--machine", ""),
    c("launch-machine-semicolon", "E003", "launch", "--dry-run", "--machine", "m;id"),
    c("launch-machine-dollar", "E003", "launch", "--dry-run", "--machine", "$(id)"),
    c("launch-cpus-zero", "E003", "launch", "--dry-run", "--cpus", "0"),
    c("launch-cpus-negative", "E003", "launch", "--dry-run", "--cpus", "-4"),
    c("launch-cpus-huge", "E003", "launch", "--dry-run", "--cpus", "100000"),
    c("launch-cpus-text", "E003", "launch", "--dry-run", "--cpus", "many"),
    c("launch-cpus-over-host", "E003", "launch", "--cpus", "100000"),
    c("launch-memory-zero", "E003", "launch", "--dry-run", "--memory", "0"),
    c("launch-memory-over-krunkit", "E031", "launch", "--dry-run", "--memory", "61441"),
    c("launch-memory-plus-vram", "E031", "launch", "--dry-run", "--memory", "61440", "--vram", "8192"),
    c("launch-vram-negative", "E003", "launch", "--dry-run", "--vram", "-1"),
    c("launch-route-bogus", "E003", "launch", "--dry-run", "--route", "cuda"),
    c("launch-log-dir-relative", "E003", "launch", "--dry-run", "--route", "apir", "--apir-log-dir", "logs"),
    c("launch-log-dir-newline", "E003", "launch", "--dry-run", "--route", "apir", "--apir-log-dir", "/tmp/a\nid"),
    c("launch-krun-missing", "E030", "launch", "--dry-run", "--krun", "work/no-krun"),
    c("launch-not-macos", "E033", "launch"),
    # --- run and bench (each fails before a VM starts) ------------------------------------------
    c("run-unknown-stack", "E001", "run", "no-such-stack", "--", "true"),
    c("run-gpu-on-cpu-stack", "E007", "run", "cpu", "--gpu", "--", "true"),
    c("run-timeout-nan", "E003", "run", "--timeout", "nan", "cpu", "--", "true"),
    c("run-timeout-zero", "E003", "run", "--timeout", "0", "cpu", "--", "true"),
    c("run-timeout-negative", "E003", "run", "--timeout", "-5", "cpu", "--", "true"),
    c("run-timeout-inf", "E003", "run", "--timeout", "inf", "cpu", "--", "true"),
    c("run-late-timeout-text", "E003", "run", "cpu", "--timeout", "soon", "--", "true"),
    c("run-route-bogus", "E003", "run", "--route", "cuda", "cpu", "--", "true"),
    c("run-model-dotdot", "E010", "run", "--model", "../../x", "cpu", "--", "true"),
    c("run-model-bad-name", "E014", "run", "--model", "a b", "cpu", "--", "true"),
    c("run-model-directory", "E003", "run", "--model", "work", "cpu", "--", "true"),
    c("rm-ref-is-directory", "E011", "model", "rm", "dirref", setup=("ref_is_directory",)),
    c("list-ref-is-directory", "ok", "model", "list", setup=("ref_is_directory",), out="not a regular file"),
    c("run-model-unknown", "E010", "run", "--model", "no-such-model", "cpu", "--", "true"),
    c("run-model-rebound", "E011", "run", "--model", "tiny-llama", "cpu", "--", "true", setup=("rebound_ref",)),
    c("run-no-stack", "E003", "run"),
    c("bench-unknown-stack", "E001", "bench", "no-such-stack"),
    c("bench-cpu-stack", "E007", "bench", "cpu"),
    c("bench-timeout-zero", "E003", "bench", "cpu", "--timeout", "0"),
    c("bench-timeout-nan", "E003", "bench", "cpu", "--timeout", "nan"),
    c("bench-out-is-file", "E003", "bench", "cpu", "--out", "work/notes.txt"),
    c("bench-compare-empty-history", "E003", "bench", "compare", "-2", "-1"),
    c("bench-compare-bad-ref", "E003", "bench", "compare", "x;rm -rf", "-1"),
    c("bench-list-last-zero", "E003", "bench", "list", "--last", "0"),
    c("bench-list-bad-format", "E003", "bench", "list", "--format", "xml"),
    # --- perplexity, serve --generate, completion -----------------------------------------------
    c("perplexity-gpu-on-cpu-stack", "E007", "perplexity", "cpu", "--model", "tiny-llama", "--gpu"),
    c("perplexity-stack-without-tool", "E006", "perplexity", "cpu", "--model", "tiny-llama"),
    c("perplexity-text-missing", "E003", "perplexity", "llama-linux", "--model", "tiny-llama", "--text", "work/no.txt"),
    c("perplexity-text-directory", "E003", "perplexity", "llama-linux", "--model", "tiny-llama", "--text", "work"),
    c("perplexity-ctx-zero", "E003", "perplexity", "llama-linux", "--model", "tiny-llama", "--ctx", "0"),
    c("perplexity-no-model", "E003", "perplexity", "llama-linux"),
    c("generate-over-user-file", "E003", "serve", "llama-linux", "--model", "tiny-llama", "--generate", "quadlet",
      "--output", "work/notes.txt"),
    c("generate-no-output", "E003", "serve", "llama-linux", "--model", "tiny-llama", "--generate", "kube"),
    c("generate-beyond-loopback", "E003", "serve", "llama-linux", "--model", "tiny-llama", "--generate", "kube",
      "--output", "work/pod.yaml", "--host", "0.0.0.0", "--allow-remote"),
    c("generate-gpu-on-cpu-stack", "E007", "serve", "cpu", "--model", "tiny-llama", "--gpu", "--generate", "kube",
      "--output", "work/pod.yaml"),
    c("generate-unknown-format", "E003", "serve", "llama-linux", "--model", "tiny-llama", "--generate", "compose",
      "--output", "work/x.yaml"),
    c("generate-ok", "ok", "serve", "llama-linux", "--model", "tiny-llama", "--generate", "quadlet", "--output",
      "work/unit.container", changes=("work/unit.container",), out="wrote quadlet"),
    c("completion-unknown-shell", "E003", "completion", "tcsh"),
    # --- host-tools, doctor, ggml, apir ------------------------------------------------------------
    c("host-tools-virgl-src-alone", "E003", "host-tools", "--virgl-src", "work"),
    c("host-tools-virgl-src-missing", "E003", "host-tools", "--apir", "--virgl-src", "work/none"),
    c("host-tools-bad-flag", "E003", "host-tools", "--bogus"),
    c("doctor-machine-slash", "E003", "doctor", "--machine", "a/b"),
    c("doctor-machine-newline", "E003", "doctor", "--machine", "a\nb"),
    c("doctor-guest-image-bad", "E003", "doctor", "--guest-image", "UPPER;rm"),
    c("doctor-extra-arg", "E003", "doctor", "extra"),
    c("ggml-no-action", "E003", "ggml"),
    c("ggml-jobs-zero", "E003", "ggml", "build", "--dry-run", "--jobs", "0"),
    c("ggml-jobs-negative", "E003", "ggml", "build", "--dry-run", "-j", "-3"),
    c("ggml-jobs-text", "E003", "ggml", "build", "--dry-run", "--jobs", "all"),
    c("ggml-variant-bogus", "E003", "ggml", "build", "--dry-run", "--variant", "metal"),
    c("ggml-cuda-arch-shell", "E003", "ggml", "build", "--dry-run", "--variant", "cuda", "--cuda-arch", "90;rm -rf /"),
    c("ggml-source-missing", "E003", "ggml", "build", "--dry-run", "--source", "work/none"),
    c("apir-no-action", "E003", "apir"),
    c("apir-bogus-action", "E003", "apir", "bogus"),
    c("apir-alloc-negative", "E003", "apir", "check", "--alloc-mib", "-1"),
    c("apir-alloc-huge", "E003", "apir", "check", "--alloc-mib", str(1 << 30)),
    c("apir-backend-missing", "E040", "apir", "check", "--backend", "work/none.so"),
    c("apir-backend-missing-json", "E040", "apir", "check", "--backend", "work/none.so", "--json", json=True),
)
