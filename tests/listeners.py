"""Which addresses processes listen on, read from /proc (what ``ss -ltunp`` shows)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp; UDP sockets count once bound (any state)


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    proto: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    def __str__(self) -> str:
        return f"{self.proto} {self.address}:{self.port} pid={self.pid} {self.command}"


def _address(hex_ip: str) -> str:
    raw = bytes.fromhex(hex_ip)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _sockets(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode()
    except OSError:
        return "?"


def listeners(pids: set[int]) -> list[Listener]:
    """Every TCP listener and bound UDP socket the processes ``pids`` hold."""
    by_inode: dict[str, int] = {}
    for pid in pids:
        by_inode |= dict.fromkeys(_sockets(pid), pid)
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if inode not in by_inode or (proto.startswith("tcp") and state != _LISTEN):
                    continue
                hex_ip, hex_port = local.split(":")
                pid = by_inode[inode]
                found.append(
                    Listener(pid, _command(pid), proto, _address(hex_ip), int(hex_port, 16))
                )
    return sorted(found, key=lambda x: (x.proto, x.port))


def session_members(sids: set[int]) -> set[int]:
    """The live processes of the sessions ``sids`` (Ray's workers lead process groups of their
    own, but stay in the session of the node that started them)."""
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[3]) in sids:
                    members.add(int(entry.name))
    return members
