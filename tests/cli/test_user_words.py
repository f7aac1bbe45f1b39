"""The words a RamaLama or ollama user types (issue #42 items 9, 10): did-you-mean for a mistyped stack,
model or command, and the top-level `pull`, `list`, `rm`, `inspect`, `info`, `version`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provision import cli
from provision.core import catalog, errors
from tests.helpers import run_provision
from tests.hosts.linux.stand_in import install_bundle


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str], exc: type[errors.ProvisionError]) -> str:
    assert cli.main(argv) == exc.exit_status
    err = capsys.readouterr().err
    assert err.startswith(f"{exc.code}: "), err
    return err


@pytest.fixture
def tiny(empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert cli.main(["model", "synth", "tiny-llama"]) == 0
    capsys.readouterr()
    return empty_cache


def test_a_mistyped_stack_gets_the_nearest_stack(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["run", "llama-lnux", "--gpu", "--dry-run", "--", "true"], errors.UnknownStack)
    assert "fix: did you mean 'llama-linux'" in err


def test_a_mistyped_command_gets_the_nearest_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["pul", "tiny-llama"], errors.InvalidValue)
    assert "invalid choice: 'pul'" in err and "fix: did you mean 'pull'?" in err
    err = error_of(capsys, ["model", "lst"], errors.InvalidValue)
    assert "fix: did you mean 'list'?" in err
    err = error_of(capsys, ["zzzzqqq"], errors.InvalidValue)  # nothing near: no guess
    assert "did you mean" not in err and "fix: see `provision --help`" in err


@pytest.mark.parametrize("argv", [["model", "path", "tiny-lama"], ["inspect", "tiny-lama"],
                                  ["serve", "llama-linux", "--model", "tiny-lama", "--dry-run"]])  # fmt: skip
def test_a_mistyped_model_gets_the_nearest_model(tiny: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str]) -> None:  # fmt: skip
    err = error_of(capsys, argv, errors.UnknownModel)
    assert "did you mean 'tiny-llama'" in err


def test_a_model_like_nothing_known_gets_no_guess(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean" not in error_of(capsys, ["model", "path", "zzzzqqq"], errors.UnknownModel)


def test_top_level_list_inspect_rm_are_the_model_actions(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["command"] == "list" and listed["status"] == "ok"
    assert cli.main(["model", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"] == listed["data"]
    assert cli.main(["inspect", "tiny-llama", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["architecture"] == "llama"
    assert cli.main(["rm", "tiny-llama"]) == 0
    capsys.readouterr()
    assert not list((tiny / "models" / "refs").glob("tiny-llama.json"))
    error_of(capsys, ["model", "path", "tiny-llama"], errors.UnknownModel)


def test_top_level_pull_stores_a_catalog_model(empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-llama is pinned as synthesized: its pull writes it here, offline, and checks the pin
    assert cli.main(["pull", "tiny-llama", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["name"] == "tiny-llama" and Path(data["path"]).is_file()
    assert (empty_cache / "models" / "refs" / "tiny-llama.json").is_file()


def test_version_and_info(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import provision

    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"provision {provision.__version__}"
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["version"] == provision.__version__
    assert data["cache"] == str(tiny) and data["store"]["models"] == ["tiny-llama"]
    assert "llama-linux" in data["stacks"] and data["serves"] == []


@pytest.mark.parametrize("argv", [["run", "--gpu", "--model", "tiny-llama"], ["run", "llama-linux", "--gpu"],
                                  ["run", "llama-linux", "--gpu", "--"]])  # fmt: skip
def test_run_without_a_command_is_a_usage_error(tiny: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str]) -> None:  # fmt: skip
    err = error_of(capsys, argv, errors.InvalidValue)  # not E024: nothing failed in a VM
    assert "no command to run in the guest" in err and "fix: provision run [STACK]" in err


def test_run_model_plans_a_serve_then_the_chat(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Host tools are a stand-in bundle in a fresh cache (the plan needs them: E020 without); the stack is
    # picked as serve picks it, so the bundle holds a guest for every stack --gpu may pick. The model is
    # the catalog's, not yet made: the plan names where it will be and makes nothing, not even the store.
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    gpu_stacks = [s for s in catalog.load().stacks.values() if s.gpu and "linux" in s.hosts]
    install_bundle(*gpu_stacks)
    before = sorted(p.relative_to(empty_cache) for p in empty_cache.rglob("*"))
    proc = run_provision("run", "tiny-llama", "--gpu", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["then"] == "chat, stop"
    assert "exec llama-server" in data["job"] and "tiny-llama" in data["job"]
    assert "provision: route:" in proc.stderr  # the stack was picked as serve picks it, and said why
    # a dry run writes nothing: no file, no folder (the model store included) but the probes' empty
    # jobs/ folder, and no record of its probes left there
    after = sorted(p.relative_to(empty_cache) for p in empty_cache.rglob("*"))
    assert [p for p in after if p not in before] == [Path("jobs")]
    assert not (empty_cache / "models").exists()


def test_serve_model_is_serve_with_that_model(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    # `ramalama serve MODEL`: the same plan as `serve --model MODEL`, the stack picked the same way
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    install_bundle(*[s for s in catalog.load().stacks.values() if s.gpu and "linux" in s.hosts])
    plans = []
    for argv in (["serve", "tiny-llama"], ["serve", "--model", "tiny-llama"]):
        proc = run_provision(*argv, "--gpu", "--port", "8123", "--dry-run", "--json")
        assert proc.returncode == 0, proc.stderr
        plans.append(json.loads(proc.stdout)["data"])
    assert plans[0] == plans[1] and "tiny-llama" in json.dumps(plans[0])
    for argv, code in ((["serve", "llama-linux", "--gpu"], errors.InvalidValue),
                       (["serve", "--gpu"], errors.InvalidValue),
                       (["serve", "tiny-lama", "--gpu"], errors.UnknownStack)):  # fmt: skip
        err = error_of(capsys, argv, code)
        assert "fix: did you mean 'tiny-llama'" in err if code is errors.UnknownStack else "fix: provision serve" in err
    # a reference nobody pulled is a model all the same: its fix pulls it (not "neither a stack nor a model")
    for ref in ("ollama://tiny", "kquant:latest"):
        assert cli.main(["serve", ref, "--gpu", "--dry-run"]) == errors.UnknownModel.exit_status
        err = capsys.readouterr().err  # after the route line: the stack was picked, then the model looked up
        assert "E010: " in err and f"fix: provision model pull {ref}" in err
    # with --model the word is a stack
    assert "unknown stack 'tiny-llama'" in error_of(capsys, ["serve", "tiny-llama", "--model", "tiny-llama"],
                                                    errors.UnknownStack)  # fmt: skip


def test_run_of_a_mistyped_model_names_the_model(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["run", "tiny-lama", "--gpu"], errors.UnknownStack)
    assert "neither a stack nor a model" in err and "did you mean 'tiny-llama'" in err


def test_perplexity_without_a_stack_or_gpu_says_how_to_pick_one(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["perplexity", "--model", "tiny-llama"], errors.InvalidValue)
    assert "fix: provision perplexity --gpu" in err


@pytest.mark.slow
def test_perplexity_picks_the_stack_as_run_and_serve_do(tmp_path: Path) -> None:
    # The machine's own cache (host tools, the guest image, tiny-llama); the history goes to a fresh state dir
    proc = run_provision("perplexity", "--model", "tiny-llama", "--gpu", "--json", timeout=900,
                         env={"PROVISION_STATE": str(tmp_path / "state")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "provision: route:" in proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["ppl"] > 1 and data["model"] == "tiny-llama" and data["history"]["id"]


@pytest.mark.slow
def test_run_model_serves_chats_and_stops() -> None:
    # The machine's cache (host tools, the guest image, tiny-llama), as `ramalama run` is used: one turn, then /exit
    proc = run_provision("run", "tiny-llama", "--gpu", stdin="Hello\n/exit\n", timeout=900)
    assert proc.returncode == 0, proc.stderr
    (name,) = re.findall(r"provision: (\S+) is healthy at http://127\.0\.0\.1:\d+/v1", proc.stderr)
    assert f"provision: stopped {name}" in proc.stderr
    assert proc.stdout.count("you> ") == 2 and len(proc.stdout) > 20  # the prompt twice, a reply between
    ps = run_provision("ps", "--json")
    assert name not in [e["name"] for e in json.loads(ps.stdout)["data"]]  # stopped: no serve, no guest left
