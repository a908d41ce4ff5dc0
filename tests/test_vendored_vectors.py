"""The test suite stands on its own: the conformance vectors are vendored, unchanged, and a copy
of the repository with nothing beside it collects every test."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance import VECTOR_DIR, load_vectors

ROOT = Path(__file__).resolve().parents[1]


def _sums() -> dict[str, str]:
    lines = (VECTOR_DIR / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}


def test_every_vendored_file_matches_its_recorded_digest() -> None:
    sums = _sums()
    files = sorted(p.name for p in VECTOR_DIR.glob("*.json"))
    assert files == sorted(sums), "SHA256SUMS must list exactly the vendored files"
    for name in files:
        digest = hashlib.sha256((VECTOR_DIR / name).read_bytes()).hexdigest()
        assert digest == sums[name], f"{name} differs from the vendored copy"


def test_the_readme_names_every_vendored_file() -> None:
    readme = (VECTOR_DIR / "README.md").read_text(encoding="utf-8")
    for name in _sums():
        assert f"`{name}`" in readme, name
    assert "anima-research/mcpl" in readme and "MIT" in readme


def test_load_vectors_keeps_unnormalized_text() -> None:
    # the manifest vectors hold both spellings of one letter; a normalizing loader merges them
    text = repr(load_vectors("manifest-digest-vectors.json"))
    assert "\u00e9" in text and "e\u0301" in text


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [f for f in out.stdout.decode().split("\0") if f]


@pytest.mark.slow
def test_a_copy_with_nothing_beside_it_collects_every_test(tmp_path: Path) -> None:
    """The repository's files alone, in an empty folder (no sibling folders at all), collect
    the whole suite without an error."""
    clone = tmp_path / "alone" / "mcplive"
    for name in _tracked_files():
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert " error" not in done.stdout.splitlines()[-1], tail
    assert list((tmp_path / "alone").iterdir()) == [clone]
