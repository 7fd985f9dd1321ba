"""Files a run takes in and gives back (SandboxFusion's ``files`` / ``fetch_files``), safely.

Paths are relative to the program's work dir and validated before anything is written: no absolute path,
no ``..``, no empty or ``.`` component, no NUL, at most :data:`MAX_DEPTH` components, no file that is
also another's directory. Input files are unpacked into the run's size-limited tmpfs ``/work`` by ``tar``
inside the sandbox, from a memfd (nothing touches the host disk; one descriptor whatever their number).
Files to fetch are read back inside the sandbox, after the program exits, by ``tar`` writing to a pipe (a
symlink the program made is never followed outside the sandbox). Only regular files come back; a path that
is missing, a directory or a symlink is left out (as SandboxFusion leaves out a missing file), and nothing
comes back over :data:`MAX_FETCH_BYTES`. Unsafe mode writes and reads a private host scratch directory
instead, through descriptors that never follow a symlink. Compile steps get the input files in their build
directory.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import posixpath
import stat
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
    """``path`` as given when it is a plain relative path (components joined by single ``/``, none empty, ``.``
    or ``..``: so no leading ``./``, no ``a//b``, no trailing ``/``; at most :data:`MAX_DEPTH` of them), else
    :class:`FieldError` naming ``label``."""
    if not isinstance(path, str):
        raise FieldError(f"{label} must be a string path, got {type_name(path)}")
    if not path or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise FieldError(f"{label} must be a non-empty path of at most {MAX_PATH_CHARS} characters without NUL")
    if path.startswith("/"):
        raise FieldError(f"{label} {path!r:.60} is absolute; paths are relative to the work dir")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise FieldError(f"{label} {path!r:.60} has an empty, '.' or '..' component")
    if len(parts) > MAX_DEPTH:
        raise FieldError(f"{label} {path!r:.60} is deeper than {MAX_DEPTH} directories")
    return path


def check_inputs(files: Any, reserved: tuple[str, ...] = (), label: str = "files", *,
                 max_file_bytes: int | None = None) -> dict[str, bytes]:
    """``files`` (paths -> base64 text, or null: skipped) decoded once: normalised path -> bytes. Paths, count,
    total size, each file's size (at most ``max_file_bytes``: what the program may write) and names are
    checked; a path may not be, or lie under, one of ``reserved`` (the program's own files)."""
    if not isinstance(files, dict):
        raise FieldError(f"{label} must be an object of path: base64 content, got {type_name(files)}")
    if len(files) > MAX_FILES:
        raise FieldError(f"{label} has {len(files)} files, more than {MAX_FILES}")
    total, out = 0, {}
    for path, content in files.items():
        name = check_path(path, f"{label} path")
        if content is None or SKIP_MARK in name:
            continue
        if not isinstance(content, str):
            raise FieldError(f"{label}[{path!r:.60}] must be base64 text or null, got {type_name(content)}")
        total += len(content) * 3 // 4
        if total > MAX_INPUT_BYTES:
            raise FieldError(f"{label} are larger than {MAX_INPUT_BYTES} bytes in all")
        if name.split("/")[0] in reserved:
            raise FieldError(f"{label} path {name!r:.60} is, or lies under, the program's own file")
        data = _decode(content, f"{label}[{path!r:.60}]")
        if max_file_bytes is not None and len(data) > max_file_bytes:
            raise FieldError(f"{label}[{path!r:.60}] is {len(data)} bytes, over the file-size limit of "
                             f"{max_file_bytes} bytes (limits.file_size_mb)")
        out[name] = data
    _check_tree(list(out), label)
    return out


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


def input_fd(inputs: dict[str, bytes]) -> int:
    """A memfd holding ``inputs`` as a tar stream (regular files, mode 0666; directories 0777: inside the
    run's private tmpfs the program may modify them), read from the start; the caller passes it to the
    sandbox and closes it."""
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
    return _memfd("credo-inputs", buffer.getbuffer())


def list_fd(paths: tuple[str, ...]) -> int:
    """A memfd holding ``paths`` (normalised) NUL-terminated, for ``tar --null -T -``: no path is ever part
    of a command line (64 long paths would not fit in one)."""
    return _memfd("credo-fetch", b"".join(check_path(p, "fetch_files path").encode() + b"\0" for p in paths))


def _memfd(name: str, data) -> int:
    fd = os.memfd_create(name)
    try:
        view = memoryview(data)
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


def wrap_argv(argv: list[str], *, inputs_fd: int | None, fetch_fd: int | None, list_fd: int | None) -> list[str]:
    """``argv`` wrapped in bash inside the sandbox: ``tar`` first unpacks the input files from ``inputs_fd``
    into ``/work``; the program then runs without the wrapper's descriptors, with its own stderr (bash's
    stderr is /dev/null, so a death by signal adds no "Segmentation fault" line); then ``tar`` writes the
    NUL-separated paths read from ``list_fd`` to ``fetch_fd`` (hard links as whole files; :func:`read_tar`
    keeps regular files only) and the wrapper exits with the program's status (a death by signal N is
    128 + N, as bubblewrap reports it)."""
    steps = ["exec {err}>&2 2>/dev/null"]
    if inputs_fd is not None:
        steps.append(f"{TAR} -x -f - -C /work <&{inputs_fd} || "
                     "{ echo 'credo: the input files do not fit in /work' >&$err; exit 1; }")
        steps.append(f"exec {inputs_fd}<&-")
    if fetch_fd is None:
        steps.append('exec "$@" 2>&$err {err}>&-')
    else:
        steps += [f'"$@" 2>&$err {{err}}>&- {fetch_fd}>&- {list_fd}<&-', "rc=$?",
                  f"{TAR} -c -f - -C /work --no-recursion --hard-dereference --null --verbatim-files-from -T - "
                  f"<&{list_fd} >&{fetch_fd}", "exit $rc"]
    return ["/usr/bin/bash", "-c", "; ".join(steps), "credo-run", *argv]


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_host(directory: Path, inputs: dict[str, bytes], owner: tuple[int, int] | None = None) -> None:
    """Write ``inputs`` under a fresh, private host ``directory`` (unsafe mode, compile steps) through
    descriptors: every component is opened with ``O_NOFOLLOW`` and every file created with ``O_EXCL``, so a
    symlink or an existing entry is never written through. Files are 0644 and directories 0755 (umask
    permitting), owned by ``owner`` (uid, gid) when given. A path that cannot be written raises ValueError."""
    root = os.open(directory, _DIR_FLAGS)
    try:
        for name, data in inputs.items():
            parts = check_path(name, "files path").split("/")
            try:
                fd = _walk(root, parts[:-1], owner=owner, create=True)
                try:
                    out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  0o644, dir_fd=fd)
                finally:
                    if fd != root:
                        os.close(fd)
                with os.fdopen(out, "wb") as handle:
                    if owner is not None:
                        os.fchown(handle.fileno(), *owner)
                    handle.write(data)
            except OSError as exc:
                raise ValueError(f"input file {name!r:.60} could not be written: {exc.strerror}") from None
    finally:
        os.close(root)


def _walk(root: int, parts: list[str], *, owner: tuple[int, int] | None = None, create: bool = False) -> int:
    """A descriptor of the directory ``parts`` below ``root``, each component opened with ``O_NOFOLLOW`` (a
    symlink raises OSError); missing ones are made (0755, ``owner``) when ``create``. The caller closes it
    unless it is ``root``."""
    fd = root
    for part in parts:
        made = False
        if create:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
        try:
            below = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            if fd != root:
                os.close(fd)
        fd = below
        if made and owner is not None:
            os.fchown(fd, *owner)
    return fd


def read_host(directory: Path, paths: tuple[str, ...], cap: int = MAX_FETCH_BYTES, owner: int | None = None
              ) -> dict[str, bytes]:
    """Regular files named in ``paths`` under host ``directory`` (unsafe mode), read through descriptors
    opened with ``O_NOFOLLOW`` at every component: a symlink, even a symlinked parent directory, is left out,
    and so is a file not owned by uid ``owner`` when given (a hard link to someone else's file). Over ``cap``
    bytes in all, nothing comes back."""
    out: dict[str, bytes] = {}
    left = cap
    root = os.open(directory, _DIR_FLAGS)
    try:
        for path in paths:
            if path in out:
                continue
            data = _read_one(root, check_path(path, "fetch_files path").split("/"), owner, left)
            if data is None:
                continue
            if len(data) > left:
                return {}
            left -= len(data)
            out[path] = data
    finally:
        os.close(root)
    return out


def _read_one(root: int, parts: list[str], owner: int | None, left: int) -> bytes | None:
    """The regular file ``parts`` below ``root`` (at most ``left + 1`` bytes read), or None."""
    try:
        fd = _walk(root, parts[:-1])
        try:
            handle = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        finally:
            if fd != root:
                os.close(fd)
    except OSError:
        return None
    try:
        st = os.fstat(handle)
        if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
            return None
        chunks, size = [], 0
        while size <= left and (chunk := os.read(handle, min(1 << 20, left + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(handle)


def encode(files: dict[str, bytes]) -> dict[str, str]:
    """Path -> base64 text (SandboxFusion's response ``files``)."""
    return {name: base64.b64encode(data).decode("ascii") for name, data in files.items()}
