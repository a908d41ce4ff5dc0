"""The service files in ``examples/``: the systemd unit (parsed here, and verified by
``systemd-analyze verify`` where the machine has it) and the Dockerfile (parsed here; never
built by the tests)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "examples" / "mcplive.service"
DOCKERFILE = ROOT / "examples" / "Dockerfile"
#: The signals on which ``mcplive run`` stops cleanly (see ``actors.cli.command._run``).
STOP_SIGNALS = {"SIGINT", "SIGTERM"}


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: section -> key -> every value given (in order). Comments, blank
    lines and backslash continuations as systemd reads them; a line outside a section or
    without ``=`` is an error."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        if current is None or not sep:
            raise ValueError(f"line {number}: not a key=value line inside a section: {raw!r}")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, (INSTRUCTION, arguments), continuations joined and
    comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def only(values: list[str] | None, key: str) -> str:
    assert values is not None and len(values) == 1, f"{key}: expected exactly one value"
    return values[0]


def test_the_unit_runs_the_host_restarts_it_and_reloads_it() -> None:
    unit = parse_unit(UNIT.read_text(encoding="utf-8"))
    service = unit["Service"]
    argv = shlex.split(only(service.get("ExecStart"), "ExecStart"))
    assert Path(argv[0]).name == "mcplive" and Path(argv[0]).is_absolute()
    assert argv[1] == "run" and len(argv) == 3 and argv[2].endswith(".toml")
    assert only(service.get("Restart"), "Restart") == "on-failure"
    assert only(service.get("ExecReload"), "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert only(service.get("KillSignal"), "KillSignal") in STOP_SIGNALS
    assert only(service.get("User"), "User") not in ("root", "0")
    # the data dir the service owns is where it runs
    state = only(service.get("StateDirectory"), "StateDirectory")
    assert only(service.get("WorkingDirectory"), "WorkingDirectory") == f"/var/lib/{state}"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart names an executable: point it at this environment's mcplive
    here = Path(sys.executable).parent / "mcplive"
    if not here.exists():
        pytest.skip("no mcplive executable beside this interpreter")
    text = UNIT.read_text(encoding="utf-8").replace("/opt/mcplive/bin/mcplive", str(here))
    copy = tmp_path / UNIT.name
    copy.write_text(text, encoding="utf-8")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert UNIT.name not in output, output  # no warning about our file (unknown keys, …)


def test_the_unit_parser_refuses_what_systemd_would_not_read() -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_unit("ExecStart=/bin/true\n")
    with pytest.raises(ValueError, match="line 2"):
        parse_unit("[Service]\nExecStart /bin/true\n")
    assert parse_unit("[A]\n# c\nK=a \\\n  b\nK=c\n") == {"A": {"K": ["a b", "c"]}}


def test_the_dockerfile_installs_runs_unprivileged_keeps_data_and_checks_health() -> None:
    steps = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM" and steps[0][1].startswith("python:3.")
    for kind, args in steps:
        if kind == "COPY":  # everything copied exists in the build context (the repository)
            *sources, _ = args.split()
            assert all((ROOT / s).exists() for s in sources), args
    install = [a for k, a in steps if k == "RUN" and "pip install" in a]
    assert install, "no RUN installs mcplive"
    user = [(i, a) for i, (k, a) in enumerate(steps) if k == "USER"]
    assert len(user) == 1 and user[0][1] not in ("root", "0")
    assert user[0][0] > kinds.index("RUN"), "the install runs as root, the host does not"
    assert "useradd" in install[0] and user[0][1] in install[0]
    workdir = [a for k, a in steps if k == "WORKDIR"][-1]
    volume = [a for k, a in steps if k == "VOLUME"]
    assert len(volume) == 1 and f'"{workdir}"' in volume[0]
    entry = [a for k, a in steps if k == "ENTRYPOINT"][-1]
    cmd = [a for k, a in steps if k == "CMD"][-1]
    assert entry == '["mcplive"]'
    assert cmd.startswith('["run", "') and cmd.endswith('.toml"]')
    config = cmd.split('"')[3]
    health = [a for k, a in steps if k == "HEALTHCHECK"]
    assert len(health) == 1
    options, _, check = health[0].partition(" CMD ")
    assert all(o.startswith("--") for o in options.split())
    # the same config as the host; status's codes 3 and 4 mapped to docker's "unhealthy" (1)
    assert check == f"mcplive status {config} || exit 1"
    assert [a for k, a in steps if k == "STOPSIGNAL"] == ["SIGTERM"]


def test_the_dockerfile_parser_joins_continuations() -> None:
    text = "# c\nFROM a\nRUN x \\\n    && y\n\nHEALTHCHECK --interval=1s \\\n  CMD z\n"
    assert parse_dockerfile(text) == [
        ("FROM", "a"),
        ("RUN", "x && y"),
        ("HEALTHCHECK", "--interval=1s CMD z"),
    ]
