"""The files tunedash keeps under its state folder on this machine: folders 0700, files 0600, written whole
(a temporary file, fsync, rename or link), never through a symbolic link. LocalHost's file primitives; the
shell versions for SSH hosts are in shell_scripts."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path

from app.core.hosts.base import PathAge


class NoFollow(OSError):
    """A symbolic link (or a folder where a file belongs) under the state folder: not followed, nothing written."""


def private_folder(state_dir: str, folder: Path) -> None:
    """Create `folder` (and its parents). Inside the state folder (`state_dir` or below it): each folder created
    is 0700, each one from `folder` up to the state folder is tightened to 0700 when found wider (what an older
    tunedash left at 0755), and a symbolic link among them below the state folder raises NoFollow. The state
    folder itself may be a link of the user's (moved to another disk). The same rule as the shell's
    (shell_scripts: `folder`)."""
    state = state_dir.rstrip("/") or "/"
    text = str(folder)
    if text != state and not text.startswith(state + "/"):
        folder.mkdir(parents=True, exist_ok=True)
        return
    missing = []
    at = folder
    while not os.path.lexists(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(made, 0o700)
    at = folder
    while True:
        top = str(at) == state or at == at.parent
        found = os.stat(at) if top else os.lstat(at)
        if stat.S_ISLNK(found.st_mode):
            raise NoFollow(f"{at} is a symbolic link; tunedash follows no link inside its state folder {state}: "
                           "remove it")
        if found.st_mode & 0o077 and found.st_uid == os.geteuid():
            with contextlib.suppress(PermissionError):
                os.chmod(at, 0o700)
        if top:
            return
        at = at.parent


def _open_nofollow(path: str, flags: int) -> int:
    """os.open with O_NOFOLLOW (files 0600); a link there raises NoFollow, naming it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NoFollow(f"{path} is a symbolic link; tunedash follows no link in its state folder: "
                           "remove it") from None
        raise


def path_age(path: str, read: int) -> PathAge | None:
    """LocalHost.path_age in-line (one lstat; one small read of a plain file when asked)."""
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if read <= 0 or not stat.S_ISREG(found.st_mode):
        return PathAge(time.time() - found.st_mtime, stat.S_ISREG(found.st_mode))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return PathAge(time.time() - found.st_mtime, False)  # replaced by a link meanwhile
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return PathAge(time.time() - found.st_mtime, False)
        data = handle.read(read + 1)
    return PathAge(time.time() - found.st_mtime, True, data[:read].decode(errors="replace"), len(data) > read)


def _read_nofollow(path: Path) -> str | None:
    """The file's text (None when it does not exist), never through a link (NoFollow)."""
    try:
        fd = _open_nofollow(str(path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode()


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_beside(target: Path, text: str) -> str:
    """A temporary file of its own beside `target` (0600, as mkstemp makes it) holding `text`, flushed to disk."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode())
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        os.unlink(tmp_name)
        raise
    return tmp_name


def replace_file(target: Path, text: str, expect: str | None, compare: bool) -> bool:
    """Write `text` to a temporary file of its own beside `target`, fsync it, and rename it over `target`
    (then fsync the folder); the rename replaces a link at `target`, never follows it. With `compare`, the
    rename happens under an flock on `<target>.lock` and only if `target` still holds `expect` (None: does not
    exist); False otherwise and nothing changes; a link at `target` or at its lock raises NoFollow."""
    if os.path.isdir(target) and not os.path.islink(target):
        raise NoFollow(f"{target} is a folder; it was left as it was")
    tmp_name = _temp_beside(target, text)
    try:
        if compare:
            with os.fdopen(_open_nofollow(f"{target}.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                if _read_nofollow(target) != expect:
                    return False
                os.replace(tmp_name, target)
        else:
            os.replace(tmp_name, target)
        tmp_name = ""
        _fsync_folder(target.parent)
        return True
    finally:
        if tmp_name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)


def create_exclusive(target: Path, text: str) -> bool:
    """Host.create_exclusive here: a flushed temporary file, hard-linked to `target` (link(2) fails when anything,
    a link included, is there), then the temporary name removed."""
    tmp_name = _temp_beside(target, text)
    try:
        os.link(tmp_name, target, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp_name)
    _fsync_folder(target.parent)
    return True
