"""Shell completion: argcomplete's scripts, loaded by the real shells, completing stack and model names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_provision

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def shell_env(cache: Path) -> dict[str, str]:
    assert (BIN / "provision").is_file(), f"no provision script in {BIN}: pip install -e ."
    # PYTHONPATH: the `provision` script of an editable install imports the tree it was installed from;
    # the shells must run this tree's code
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PROVISION_CACHE": str(cache), "PYTHONPATH": str(ROOT)}


def need(shell: str) -> str:
    found = shutil.which(shell)
    assert found, f"{shell} is needed for this test: scripts/setup-debian installs it"
    return found


BASH_DRIVER = r"""
set -e
source <(provision completion bash)
complete -p provision
ask() {  # what bash's TAB would show for the line "$1"
  COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"
  [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
  _python_argcomplete provision "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  echo "@@ $1"; printf '%s\n' "${COMPREPLY[@]}"
}
ask "provision run llama-l"
ask "provision bench run llama-linux --model tiny"
ask "provision perplexity "
ask "provision ser"
"""


def sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("@@ "):
            key = line[3:]
            out[key] = []
        elif key is not None and line.strip():
            out[key].append(line.strip())
    return out


def test_bash_loads_the_script_and_completes_stack_and_model_names(empty_cache: Path) -> None:
    proc = subprocess.run([need("bash"), "-c", BASH_DRIVER], capture_output=True, text=True, timeout=120,
                          env=shell_env(empty_cache))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "-F _python_argcomplete provision" in proc.stdout
    got = sections(proc.stdout)
    assert got["provision run llama-l"] == ["llama-linux"]
    assert got["provision bench run llama-linux --model tiny"] == ["tiny-llama"]
    assert {"llama-linux", "cpu", "llama-apir-linux"} <= set(got["provision perplexity "])
    assert got["provision ser"] == ["serve"]


def test_fish_loads_the_script_and_completes_a_stack_name(empty_cache: Path) -> None:
    script = 'provision completion fish | source; and complete -C "provision run llama-l"'
    proc = subprocess.run([need("fish"), "--no-config", "-c", script], capture_output=True, text=True,
                          timeout=120, env=shell_env(empty_cache))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()] == ["llama-linux"]


def test_zsh_loads_the_script_and_registers_it(empty_cache: Path) -> None:
    script = ("autoload -U compinit && compinit -u -D && source <(provision completion zsh) "
              "&& print -r -- ${_comps[provision]}")  # fmt: skip
    proc = subprocess.run([need("zsh"), "-f", "-c", script], capture_output=True, text=True, timeout=120,
                          env=shell_env(empty_cache))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "_python_argcomplete"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_script_for_each_shell(shell: str) -> None:
    proc = run_provision("completion", shell)
    assert proc.returncode == 0 and "provision" in proc.stdout and "_ARGCOMPLETE" in proc.stdout


def test_an_unknown_shell_is_e003() -> None:
    proc = run_provision("completion", "tcsh2")
    assert proc.returncode == 13 and "E003" in proc.stderr


SERVE_HOLDER = """
import sys, time
from provision.serve import state
entry = state.claim(state.own_entry(name=sys.argv[1], stack="cpu", model="tiny-llama", gpu=False,
                                    host="127.0.0.1", port=18111))
print("claimed", flush=True)
time.sleep(120)
"""


def test_bash_completes_short_names_running_serves_and_run_model(empty_cache: Path) -> None:
    # A serve as `provision ps` sees one: its entry claimed by a live process (the completer reads that registry)
    env = shell_env(empty_cache)
    holder = subprocess.Popen([sys.executable, "-c", SERVE_HOLDER, "tiny-18111"], stdout=subprocess.PIPE, text=True,
                              env=env)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        lines = ["provision chat ", "provision stop tiny", "provision pull qwen2.5", "provision model pull smol",
                 "provision run tiny"]  # fmt: skip
        driver = BASH_DRIVER.split("ask \"provision run llama-l\"")[0] + "".join(f'ask "{line}"\n' for line in lines)
        proc = subprocess.run([need("bash"), "-c", driver], capture_output=True, text=True, timeout=120, env=env)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stderr
    got = sections(proc.stdout)
    assert "tiny-18111" in got["provision chat "]  # beside chat's options
    assert got["provision stop tiny"] == ["tiny-18111"]
    assert any(n.startswith("qwen2.5") and ":" in n for n in got["provision pull qwen2.5"]), got  # a short name
    assert any(n.startswith("smollm2") and ":" in n for n in got["provision model pull smol"]), got
    assert "tiny-llama" in got["provision run tiny"]  # `run MODEL`
