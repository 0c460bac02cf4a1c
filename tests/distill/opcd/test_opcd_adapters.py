"""Adapters are written atomically: a write that fails or is killed leaves nothing at the target."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from distill.opcd.adapters import AdapterExistsError, atomic_directory, read_metadata, remove_partial_writes


def test_completed_write_appears_whole(tmp_path):
    with atomic_directory(tmp_path / "a1") as partial:
        (partial / "weights.bin").write_bytes(b"x" * 10)
        assert not (tmp_path / "a1").exists()
    assert (tmp_path / "a1" / "weights.bin").read_bytes() == b"x" * 10
    assert [p.name for p in tmp_path.iterdir()] == ["a1"]


def test_failed_write_leaves_no_directory(tmp_path):
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "a1") as partial:
        (partial / "weights.bin").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_killed_write_leaves_only_a_partial_that_cleanup_removes(tmp_path):
    script = textwrap.dedent(f"""
        import os
        from distill.opcd.adapters import atomic_directory
        with atomic_directory({str(tmp_path / "a1")!r}) as partial:
            (partial / "weights.bin").write_bytes(b"half")
            os._exit(9)  # like SIGKILL: no cleanup runs
    """)
    subprocess.run([sys.executable, "-c", script], check=False)
    assert not (tmp_path / "a1").exists()
    assert len(list(tmp_path.iterdir())) == 1
    assert len(remove_partial_writes(tmp_path)) == 1
    assert list(tmp_path.iterdir()) == []


def test_existing_target_is_refused_unless_overwrite(tmp_path):
    with atomic_directory(tmp_path / "a1") as partial:
        (partial / "v").write_text("1")
    with pytest.raises(AdapterExistsError, match="written once"), atomic_directory(tmp_path / "a1"):
        pass
    with atomic_directory(tmp_path / "a1", overwrite=True) as partial:
        (partial / "v").write_text("2")
    assert (tmp_path / "a1" / "v").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["a1"]
    assert read_metadata(tmp_path / "a1") == {}
