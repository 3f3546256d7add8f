"""storage/atomic.py: a file or folder written through it is at its name whole (the old one or the
new one, never a mix), an exception leaves the old one and no temporary, the bytes and the folder
entry are fsynced, and what a killed writer left behind does not stop the next write."""
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage.atomic import TMP_DIR_PREFIX, atomic_dir, atomic_path, atomic_write, atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def fsyncs(monkeypatch):
    """Every fsync as (inode, is a folder, inode the name `watch[0]` held at that moment)."""
    calls, watch, real = [], [], os.fsync

    def record(fd):
        st = os.fstat(fd)
        at_target = os.stat(watch[0]).st_ino if watch and os.path.exists(watch[0]) else None
        calls.append((st.st_ino, stat.S_ISDIR(st.st_mode), at_target))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls, watch


def test_the_target_is_replaced_whole(tmp_path):
    target = tmp_path / "report.md"
    target.write_bytes(b"the old content, longer than the new one\n")
    with atomic_write(target) as f:
        f.write(b"new")
        f.flush()
        assert target.read_bytes() == b"the old content, longer than the new one\n"  # not yet
    assert target.read_bytes() == b"new"
    assert _names(tmp_path) == ["report.md"]
    assert atomic_write_text(tmp_path / "sub" / "t.txt", "h\u00e9\n").read_bytes() == "h\u00e9\n".encode()


@pytest.mark.parametrize("how", ["file object", "path"])
def test_an_exception_leaves_the_old_content_and_no_temporary(tmp_path, how):
    target = tmp_path / "shard.parquet"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk died"):
        if how == "file object":
            with atomic_write(target) as f:
                f.write(b"half of the new")
                raise RuntimeError("disk died")
        else:
            with atomic_path(target) as tmp:
                tmp.write_bytes(b"half of the new")
                raise RuntimeError("disk died")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["shard.parquet"]


def test_only_new_file_modes():
    with pytest.raises(ValueError, match="'ab'"):
        with atomic_write("x", "ab"):
            pass


def test_the_file_and_its_folder_are_fsynced_before_and_after_the_rename(tmp_path, fsyncs):
    calls, watch = fsyncs
    target = tmp_path / "manifest.json"
    target.write_text("old")
    watch.append(target)
    atomic_write_text(target, "new")
    new, folder = target.stat().st_ino, tmp_path.stat().st_ino
    file_syncs = [c for c in calls if c[0] == new]
    assert file_syncs and not file_syncs[0][1]
    assert file_syncs[0][2] != new  # the bytes reached the disk before the name pointed at them
    folder_syncs = [c for c in calls if c[0] == folder]
    assert folder_syncs and folder_syncs[-1][1] and folder_syncs[-1][2] == new  # the entry after the rename


def test_a_folder_is_fsynced_file_by_file_then_its_folders_then_its_parent(tmp_path, fsyncs):
    calls, watch = fsyncs
    target = tmp_path / "out" / "best"
    watch.append(target)

    def write(folder: Path) -> None:
        (folder / "model").mkdir()
        (folder / "model" / "weights.bin").write_bytes(b"w")
        (folder / "config.json").write_text("{}")

    atomic_dir(target, write)
    synced = {c[0] for c in calls}
    for path in (target / "model" / "weights.bin", target / "config.json", target / "model", target, target.parent):
        assert path.stat().st_ino in synced, path
    before_rename = [c for c in calls if c[0] == target.stat().st_ino]
    assert before_rename[0][2] is None  # the folder was synced before it had its name
    assert calls[-1][0] == target.parent.stat().st_ino and calls[-1][2] == target.stat().st_ino


def _old_folder(target: Path) -> dict[str, bytes]:
    (target / "sub").mkdir(parents=True)
    (target / "a.bin").write_bytes(b"old a")
    (target / "sub" / "b.bin").write_bytes(b"old b")
    return _tree(target)


def _new(folder: Path) -> None:
    (folder / "c.bin").write_bytes(b"new c")


def test_a_folder_replace_gives_the_new_folder_alone(tmp_path):
    target = tmp_path / "final"
    _old_folder(target)
    atomic_dir(target, _new)
    assert _tree(target) == {"c.bin": b"new c"}  # nothing of the old one left in it
    assert _names(tmp_path) == ["final"]


def test_a_folder_replace_that_fails_writing_keeps_the_old_folder(tmp_path):
    target = tmp_path / "final"
    old = _old_folder(target)

    def half(folder: Path) -> None:
        (folder / "a.bin").write_bytes(b"new a")
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        atomic_dir(target, half)
    assert _tree(target) == old
    assert _names(tmp_path) == ["final"]


def test_a_folder_replace_whose_rename_fails_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "final"
    old = _old_folder(target)
    real = os.rename

    def refuse_the_new_one(src, dst):
        if Path(src).name.startswith(TMP_DIR_PREFIX):
            raise OSError("rename refused")
        real(src, dst)

    monkeypatch.setattr(os, "rename", refuse_the_new_one)
    with pytest.raises(OSError, match="rename refused"):
        atomic_dir(target, _new)
    assert _tree(target) == old
    assert _names(tmp_path) == ["final"]


def test_a_folder_that_must_not_be_replaced_keeps_the_first_writers(tmp_path):
    target = tmp_path / "bm25-classes-x"
    old = _old_folder(target)
    with pytest.raises(FileExistsError):
        atomic_dir(target, _new, replace=False)
    assert _tree(target) == old
    assert _names(tmp_path) == ["bm25-classes-x"]
    assert atomic_dir(tmp_path / "fresh", lambda folder: _new(folder) or 7, replace=False) == 7
    assert _tree(tmp_path / "fresh") == {"c.bin": b"new c"}


KILLED_WRITER = textwrap.dedent('''
    import os, signal, sys
    from pathlib import Path
    from storage.atomic import atomic_dir, atomic_write

    root = Path(sys.argv[1])

    def die(folder):
        (folder / "a.bin").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGKILL)

    with atomic_write(root / "report.md") as f:
        f.write(b"half")
        f.flush()
        atomic_dir(root / "best", die)
''')


def test_what_a_killed_writer_left_does_not_break_the_next_write(tmp_path):
    (tmp_path / "report.md").write_bytes(b"old report")
    old = _old_folder(tmp_path / "best")
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=REPO, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert (tmp_path / "report.md").read_bytes() == b"old report" and _tree(tmp_path / "best") == old
    leftovers = set(_names(tmp_path)) - {"report.md", "best"}
    assert len(leftovers) == 2 and all(name.startswith(".") for name in leftovers)  # hidden from readers
    # the trainers' clean-up finds the folder's (they remove `.tmp-*` on start)
    assert [p.name for p in tmp_path.glob(f"{TMP_DIR_PREFIX}*")] == [n for n in leftovers if n.startswith(".tmp-")]

    atomic_write_text(tmp_path / "report.md", "new report")
    atomic_dir(tmp_path / "best", _new)
    assert (tmp_path / "report.md").read_text() == "new report" and _tree(tmp_path / "best") == {"c.bin": b"new c"}


def test_a_stale_temporary_under_a_fixed_name_is_cleared_not_reused(tmp_path):
    target, part = tmp_path / "manifest.json", tmp_path / "manifest.json.part"
    part.write_text("a killed writer's half")
    with atomic_write(target, "w", tmp=part) as f:
        f.write("{}")
    assert target.read_text() == "{}" and not part.exists()

    stale = tmp_path / ".tmp-v1-123-abcd"
    stale.mkdir()
    (stale / "leftover.parquet").write_bytes(b"x")
    atomic_dir(tmp_path / "v1", _new, tmp=stale)
    assert _tree(tmp_path / "v1") == {"c.bin": b"new c"} and not stale.exists()
