"""Writing result files atomically (a temporary file beside the target, then one rename), so that an
interrupted or failed run never leaves half a file and a reader never sees one; the same for a
whole folder of results (:func:`atomic_dir`); the refusal to replace an earlier run's files unless
asked; and the checks of an output path made before any work (:func:`check_output_dir`,
:func:`check_output_file`). Used by the lab, the benchmark and the command.

Files and folders made here get the permissions the user's umask gives a new file (``mkstemp`` and
``mkdtemp`` make them 0600 and 0700, readable by the owner only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ._validate import ArgumentError, _escaped

__all__ = [
    "atomic_path",
    "atomic_dir",
    "write_text",
    "existing",
    "umask",
    "apply_umask",
    "check_output_dir",
    "check_output_file",
    "foreign_entries",
]


def umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike, *, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have given it under the umask."""
    mode = (0o777 if directory else 0o666) & ~umask()
    os.chmod(path, mode)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write to; renamed onto ``path`` when the block
    ends without an error (with the umask's permissions), removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if os.path.isfile(tmp):
            apply_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside ``path`` to write a whole set of files into; when the block ends
    without an error it takes ``path``'s place in one step (the old folder, if ``replace``, moved
    aside first and removed after, so no file of it is left; without ``replace`` an existing
    non-empty ``path`` is an error). When the block raises (Ctrl-C included) the temporary folder
    is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.new.", dir=path.parent))
    try:
        yield tmp
        apply_umask(tmp, directory=True)
        if path.exists() and not (path.is_dir() and not any(path.iterdir())):
            if not replace:
                raise FileExistsError(f"{path} exists and is not empty")
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / "previous")
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / "previous", path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            if path.is_dir():
                path.rmdir()
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(text: str, path: str | os.PathLike) -> Path:
    """``text`` into ``path`` (UTF-8), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def existing(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Those of ``paths`` that exist already (what a run would replace)."""
    return [Path(p) for p in paths if Path(p).exists()]


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (the folder a new path would be made in)."""
    here = path.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def _bad(name: str, message: str, tail: str = "") -> ArgumentError:
    """An ArgumentError whose message is the option ``name``, then ``message`` (a path in it is
    taken literally), then ``tail`` (whose ``{name}`` fields are option names)."""
    return ArgumentError(name, message, template="{" + name + "} " + _escaped(message) + tail)


def _writable_parent(name: str, path: Path, what: str) -> None:
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise _bad(name, f"{path}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise _bad(name, f"{path}: cannot write {what} in {base} (no write permission)")


def foreign_entries(path: str | os.PathLike, own: Iterable[str]) -> list[str]:
    """The names in the folder ``path`` that are not among ``own`` (a run's own files and
    folders), hidden temporary entries of an interrupted run aside."""
    own = set(own)
    path = Path(path)
    if not path.is_dir():
        return []
    return sorted(
        p.name for p in path.iterdir() if p.name not in own and not p.name.startswith(".")
    )


def check_output_dir(
    name: str,
    path: str | os.PathLike,
    *,
    overwrite: bool,
    markers: Iterable[str] = (),
    own: Iterable[str] | None = None,
) -> Path:
    """Before any work: ``path`` can become the output folder of a run. A file there, or a folder
    that cannot be written, is an :class:`~rmsnorm._validate.ArgumentError` naming the option
    ``name`` and the path; so is an earlier run's output there without ``overwrite``: one of
    ``markers``, or, where ``own`` names every file a run writes (a run that replaces the whole
    folder), anything at all; and with ``own`` given, ``overwrite`` never replaces a folder that
    holds anything else."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise _bad(name, f"{path} is a file, not a directory; an output folder is expected")
    _writable_parent(name, path, "the output folder")
    if not path.is_dir():
        return path
    if not os.access(path, os.W_OK | os.X_OK):
        raise _bad(name, f"{path}: the folder is not writable")
    markers = list(markers)
    held = [m for m in markers if (path / m).exists()]
    if own is not None:
        foreign = foreign_entries(path, own)
        if foreign:
            shown = ", ".join(foreign[:5]) + (
                f" and {len(foreign) - 5} more" if foreign[5:] else ""
            )
            raise _bad(
                name,
                f"{path} holds files that are not a run's output ({shown}); the run replaces "
                "its whole folder, so choose an empty or new",
                " {" + name + "}",
            )
        held = held or foreign_entries(path, ())
    if held and not overwrite:
        what = f"{', '.join(held)}" + (" and the other files" if markers else "")
        raise _bad(
            name,
            f"{path} already holds {what} of an earlier run; pass --overwrite to replace them, "
            "or choose another",
            " {" + name + "}",
        )
    return path


def check_output_file(name: str, path: str | os.PathLike, *, overwrite: bool) -> Path:
    """Before any work: ``path`` can become an output file: not a folder, in a writable folder,
    and not existing unless ``overwrite``; :class:`~rmsnorm._validate.ArgumentError` otherwise."""
    path = Path(path)
    if path.is_dir():
        raise _bad(name, f"{path} is a folder; a file name is expected")
    _writable_parent(name, path, "the file")
    if path.exists() and not overwrite:
        raise _bad(name, f"{path} exists; pass --overwrite to replace it, or name another file")
    return path
