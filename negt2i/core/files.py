"""Reading input files that a user's folder holds (images, ``metadata.jsonl``): regular files only.

A folder of generated images may hold anything a file system can: a FIFO named ``0003.png`` (opening it
for reading waits for a writer, forever), a device node, a socket. ``open_regular`` never blocks and never
reads such a file: it checks the type before opening, opens with ``O_NONBLOCK`` (so that a FIFO swapped in
meanwhile does not block either) and checks the opened file again; anything but a regular file raises
``SpecialFileError``, an ``OSError`` whose ``strerror`` names the type, so every caller that turns an
``OSError`` into an error line (``cannot read (a FIFO, not a regular file)``) reports it like any other
unreadable file. Symlinks are followed (whether they may leave the input folder is the caller's rule).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


class SpecialFileError(OSError):
    """A path that is not a regular file (FIFO, socket, device, folder); never opened for reading."""


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a socket``, ``a character device``, ``a block device``, ``a folder`` or ``a regular file``."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _refuse(path: str | Path, mode: int) -> SpecialFileError:
    return SpecialFileError(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file; else ``SpecialFileError``
    (any other ``OSError`` as ``open`` raises it)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the check and the open
            raise _refuse(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path) -> bytes:
    """The bytes of a regular file (see ``open_regular``)."""
    with open_regular(path) as fh:
        return fh.read()
