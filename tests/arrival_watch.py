"""Reads of a file after its last byte arrived, counted by the kernel (inotify), for the tests and
bench/deploy_fleet.py: a watch on the directory the partial file lives in sees every read
(IN_ACCESS) and write (IN_MODIFY) of its files in order. A host's files are watched from this
machine through the guest's root (``/proc/PID/root``), the same inodes the guest writes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

IN_ACCESS, IN_MODIFY = 0x001, 0x002
IN_MOVED_FROM, IN_MOVED_TO = 0x040, 0x080


@dataclass
class Watch:
    """inotify on one directory: every access (a read) and modify (a write) of its files, in
    order. Reads of a file after its last write are reads after arrival."""

    directory: Path
    events: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_ACCESS | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO
        if libc.inotify_add_watch(self.fd, str(self.directory).encode(), mask) < 0:
            os.close(self.fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {self.directory}")

    def drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            pos = 0
            while pos < len(data):
                _, mask, _, size = struct.unpack_from("iIII", data, pos)
                name = data[pos + 16 : pos + 16 + size].split(b"\0", 1)[0].decode()
                self.events.append((name, mask))
                pos += 16 + size

    def reads_after_last_write(self, name: str) -> int:
        self.drain()
        mine = [m for n, m in self.events if n == name]
        last = max((i for i, m in enumerate(mine) if m & IN_MODIFY), default=-1)
        return sum(1 for m in mine[last + 1 :] if m & IN_ACCESS)

    def writes(self, name: str) -> int:
        self.drain()
        return sum(1 for n, m in self.events if n == name and m & IN_MODIFY)

    def close(self) -> None:
        os.close(self.fd)


def guest_root(netns: str) -> Path:
    """The root directory of the test host whose processes live in network namespace netns."""
    pids = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, check=True, timeout=10
    ).stdout.split()
    for pid in pids:
        root = Path(f"/proc/{pid}/root")
        if (root / "etc" / "os-release").exists():
            return root
    raise RuntimeError(f"no process of {netns} shows a root directory")
