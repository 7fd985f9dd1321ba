"""Files a run takes in and gives back (SandboxFusion's ``files`` / ``fetch_files``), safely.

Paths are relative to the program's work dir and validated before anything is written: no absolute path,
no ``..``, no empty or ``.`` component, no NUL, at most :data:`MAX_DEPTH` components, no file that is
also another's directory. Input files are unpacked into the run's size-limited tmpfs ``/work`` by ``tar``
inside the sandbox, from a memfd (nothing touches the host disk; one descriptor whatever their number).
Files to fetch are read back inside the sandbox, after the program exits, by ``tar`` writing to a pipe (a
symlink the program made is never followed outside the sandbox). Only regular files come back; a path that
is missing, a directory or a symlink is left out (as SandboxFusion leaves out a missing file), and nothing
comes back over :data:`MAX_FETCH_BYTES`. Unsafe mode writes and reads a host scratch directory instead,
refusing anything that resolves outside it. Compile steps get the input files in their build directory.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import posixpath
import tarfile
from pathlib import Path
from typing import Any

from credo.sandbox.limits import FieldError, type_name

MAX_FILES = 64  # input files of one run; also the most paths one run may fetch
MAX_INPUT_BYTES = 32 << 20  # decoded input files of one run, in all
MAX_FETCH_BYTES = 32 << 20  # fetched files of one run, in all (the tar stream read back)
MAX_DEPTH = 16
MAX_PATH_CHARS = 1024
SKIP_MARK = "IGNORE_THIS_FILE"  # SandboxFusion skips input files whose name holds this
TAR = "/usr/bin/tar"


def check_path(path: Any, label: str) -> str:
    """``path`` normalised (a leading ``./`` dropped), or :class:`FieldError` when it could leave the work dir."""
    if not isinstance(path, str):
        raise FieldError(f"{label} must be a string path, got {type_name(path)}")
    if not path or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise FieldError(f"{label} must be a non-empty path of at most {MAX_PATH_CHARS} characters without NUL")
    if path.startswith("/"):
        raise FieldError(f"{label} {path!r:.60} is absolute; paths are relative to the work dir")
    while path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise FieldError(f"{label} {path!r:.60} has an empty, '.' or '..' component")
    if len(parts) > MAX_DEPTH:
        raise FieldError(f"{label} {path!r:.60} is deeper than {MAX_DEPTH} directories")
    return posixpath.join(*parts)


def check_inputs(files: Any, reserved: tuple[str, ...] = (), label: str = "files") -> None:
    """``files`` maps paths to base64 text (or null: skipped); paths, count, total size and names are checked."""
    if not isinstance(files, dict):
        raise FieldError(f"{label} must be an object of path: base64 content, got {type_name(files)}")
    if len(files) > MAX_FILES:
        raise FieldError(f"{label} has {len(files)} files, more than {MAX_FILES}")
    total, paths = 0, []
    for path, content in files.items():
        name = check_path(path, f"{label} path")
        if content is None or SKIP_MARK in name:
            continue
        if not isinstance(content, str):
            raise FieldError(f"{label}[{path!r:.60}] must be base64 text or null, got {type_name(content)}")
        total += len(content) * 3 // 4
        if total > MAX_INPUT_BYTES:
            raise FieldError(f"{label} are larger than {MAX_INPUT_BYTES} bytes in all")
        _decode(content, f"{label}[{path!r:.60}]")
        if name in reserved:
            raise FieldError(f"{label} path {name!r} is the program's own file")
        paths.append(name)
    _check_tree(paths, label)


def check_fetch(paths: Any, label: str = "fetch_files") -> None:
    """``paths``: a list of at most :data:`MAX_FILES` work-dir paths."""
    if not isinstance(paths, list):
        raise FieldError(f"{label} must be a list of paths, got {type_name(paths)}")
    if len(paths) > MAX_FILES:
        raise FieldError(f"{label} has {len(paths)} paths, more than {MAX_FILES}")
    for i, path in enumerate(paths):
        check_path(path, f"{label}[{i}]")


def _check_tree(paths: list[str], label: str) -> None:
    seen = set(paths)
    if len(seen) != len(paths):
        raise FieldError(f"{label} names one path twice")
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            if parent in seen:
                raise FieldError(f"{label} path {parent!r:.60} is both a file and a directory")
            parent = posixpath.dirname(parent)


def _decode(content: str, label: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(f"{label} is not valid base64") from None


def decode_inputs(files: dict[str, str | None]) -> dict[str, bytes]:
    """Normalised path -> bytes of the files to write (checked by :func:`check_inputs`; null and skipped
    entries left out)."""
    out = {}
    for path, content in files.items():
        name = check_path(path, "files path")
        if content is not None and SKIP_MARK not in name:
            out[name] = _decode(content, f"files[{path!r:.60}]")
    return out


def input_fd(inputs: dict[str, bytes]) -> int:
    """A memfd holding ``inputs`` as a tar stream (regular files, mode 0666; directories 0777), read from the
    start; the caller passes it to the sandbox and closes it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for name, data in inputs.items():
            for parent in _parents(name):
                if parent not in made:
                    made.add(parent)
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o777
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o666
            tar.addfile(info, io.BytesIO(data))
    fd = os.memfd_create("credo-inputs")
    try:
        view = memoryview(buffer.getvalue())
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def wrap_argv(argv: list[str], *, inputs_fd: int | None, fetch_fd: int | None, paths: tuple[str, ...]) -> list[str]:
    """``argv`` wrapped in bash inside the sandbox: ``tar`` first unpacks the input files from ``inputs_fd``
    into ``/work``; the program then runs without either descriptor; then ``tar`` writes ``paths`` to
    ``fetch_fd`` (:func:`read_tar` keeps regular files only) and the wrapper exits with the program's status
    (a death by signal N is 128 + N, as bubblewrap reports it)."""
    steps = []
    if inputs_fd is not None:
        steps.append(f"{TAR} -x -f - -C /work <&{inputs_fd} 2>/dev/null || "
                     "{ echo 'credo: the input files do not fit in /work' >&2; exit 1; }")
        steps.append(f"exec {inputs_fd}<&-")
    if fetch_fd is None:
        steps.append('exec "$@"')
    else:
        listed = " ".join(_quote(p) for p in paths)
        steps += [f'"$@" {fetch_fd}>&-', "rc=$?",
                  f"{TAR} -c -f - -C /work --no-recursion -- {listed} >&{fetch_fd} 2>/dev/null", "exit $rc"]
    return ["/usr/bin/bash", "-c", "; ".join(steps), "credo-run", *argv]


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def read_tar(data: bytes, paths: tuple[str, ...], truncated: bool) -> dict[str, bytes]:
    """The regular files named in ``paths`` from a tar stream (nothing when it was cut at the byte cap)."""
    wanted = {check_path(p, "fetch_files path"): p for p in paths}
    out: dict[str, bytes] = {}
    if truncated or not data:
        return out
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                name = posixpath.normpath(member.name)
                if member.isreg() and name in wanted and wanted[name] not in out:
                    handle = tar.extractfile(member)
                    out[wanted[name]] = handle.read() if handle is not None else b""
    except (tarfile.TarError, OSError, EOFError):
        return out
    return out


def write_host(directory: Path, inputs: dict[str, bytes]) -> None:
    """Write ``inputs`` under a fresh host ``directory`` (unsafe mode, compile steps), never following a symlink."""
    root = directory.resolve()
    for name, data in inputs.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
            raise ValueError(f"input file {name!r} would be written outside the work dir")
        target.write_bytes(data)
        os.chmod(target, 0o666)
        for parent in _parents(name):
            os.chmod(directory / parent, 0o777)


def read_host(directory: Path, paths: tuple[str, ...], cap: int = MAX_FETCH_BYTES) -> dict[str, bytes]:
    """Regular files named in ``paths`` under host ``directory`` that resolve inside it (unsafe mode)."""
    root = directory.resolve()
    out: dict[str, bytes] = {}
    total = 0
    for path in paths:
        target = (directory / check_path(path, "fetch_files path")).resolve()
        if not target.is_relative_to(root) or not target.is_file() or path in out:
            continue
        total += target.stat().st_size
        if total > cap:
            return {}
        out[path] = target.read_bytes()
    return out


def encode(files: dict[str, bytes]) -> dict[str, str]:
    """Path -> base64 text (SandboxFusion's response ``files``)."""
    return {name: base64.b64encode(data).decode("ascii") for name, data in files.items()}
