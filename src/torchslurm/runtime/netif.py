"""Which network interface this node uses to reach MASTER_ADDR, for NCCL/GLOO_SOCKET_IFNAME.

Nodes of one job often name their NICs differently (eth0, ens1f0, enp65s0f1, eno1), so one
GLOO_SOCKET_IFNAME for all fails: Gloo needs an interface of that exact name on every node, and
job scripts end up with a per-rank `case` block. Each process asks its own kernel instead: a UDP
socket connected to the master (this sends nothing) reveals the *source address* the kernel
would use, and that address belongs to exactly one interface. `ip route get` would name `lo` on
the master itself; the source address does not. When the source is loopback anyway (Debian-style
/etc/hosts maps the host's own name to 127.0.1.1, so on the master MASTER_ADDR resolves to
loopback), we fall back to the interface holding the address this host's name resolves to, or
to the only ordinary UP interface. Decisions are pure functions of data; the effects (resolve,
connect, list interfaces) are small functions passed in as parameters.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torchslurm.errors import EnvError

__all__ = [
    "IfAddr",
    "choose_interface",
    "list_interfaces",
    "parse_ip_addr",
    "resolve",
    "socket_ifname_env",
    "source_address",
]

logger = logging.getLogger(__name__)

ENV_NAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# Bridges and veths of container runtimes hold addresses no other node can reach.
VIRTUAL_PREFIXES = ("docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "lxcbr")

IP_PATHS = ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1


@dataclass(frozen=True)
class IfAddr:
    """One address of one UP interface."""

    name: str
    """Interface name as the kernel knows it (eth0, ens1f0, lo)."""
    address: str
    """The address without prefix length or scope (198.18.0.11, fd00::2)."""

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def socket_ifname_env(
    environ: Mapping[str, str],
    master_addr: str,
    *,
    resolve_fn: Callable[[str], list[str]] | None = None,
    source_fn: Callable[[str], str | None] | None = None,
    interfaces_fn: Callable[[], list[IfAddr]] | None = None,
    own_addresses_fn: Callable[[], list[str]] | None = None,
) -> dict[str, str]:
    """The NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME values to set for this process.

    Only the variables the user did not set are returned (user values always win). Gloo gets a
    plain interface name; NCCL gets `=name`, NCCL's syntax for an exact match (a bare `eth0`
    would also match `eth01`). The *_fn parameters replace the effects in tests.
    """
    missing = [name for name in ENV_NAMES if not environ.get(name)]
    if not missing:
        return {}
    master_ips = (resolve_fn or resolve)(master_addr)
    source = next((ip for ip in map(source_fn or source_address, master_ips) if ip is not None), None)
    if source is None:
        raise EnvError(
            f"MASTER_ADDR={master_addr!r} resolves to {', '.join(master_ips)}, but this host "
            f"({socket.gethostname()}) has no route to it.", "check that MASTER_ADDR names a node "
            "of this job, or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to the interface of the cluster network."
        )
    table = (interfaces_fn or list_interfaces)()
    name, reason = choose_interface(master_addr, master_ips, source, table, (own_addresses_fn or own_addresses)())
    logger.debug("network interface %s: %s", name, reason)
    values = {"NCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name}
    return {key: values[key] for key in missing}


def choose_interface(
    master_addr: str, master_ips: Sequence[str], source: str, table: Sequence[IfAddr], own: Sequence[str]
) -> tuple[str, str]:
    """(interface name, why) for reaching the master from this host. Pure.

    master_ips: what master_addr resolves to here; source: the address the kernel picked to
    reach it; table: this host's UP interfaces; own: what this host's own name resolves to.
    """
    holder = _holder(table, source)
    if holder is None:
        raise EnvError(
            f"the kernel reaches MASTER_ADDR={master_addr!r} ({master_ips[0]}) from {source}, which no UP "
            f"interface holds ({_describe(table)}).", "set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME "
            "to the interface of the cluster network."
        )
    if not holder.loopback:
        return holder.name, f"the kernel reaches {master_addr} ({master_ips[0]}) from {source} on {holder.name}"
    if _is_local_name(master_addr):
        return holder.name, f"MASTER_ADDR={master_addr} is this machine's loopback: a single-machine run"
    # The master's name resolves to loopback here, so this is the master node: peers will
    # connect to its real address, so Gloo must not bind loopback (Gloo binds the address that
    # GLOO_SOCKET_IFNAME's interface holds, else the one the host name resolves to).
    for address in own:
        own_holder = _holder(table, address)
        if own_holder is not None and not own_holder.loopback:
            return own_holder.name, (f"{master_addr} resolves to loopback here (this is the master node); "
                                     f"this host's name resolves to {address} on {own_holder.name}")
    ordinary = sorted({entry.name for entry in table if not entry.loopback and not _virtual(entry.name)})
    if len(ordinary) == 1:
        return ordinary[0], (f"{master_addr} resolves to loopback here (this is the master node); "
                             f"{ordinary[0]} is the only non-loopback interface")
    if not ordinary:
        return holder.name, f"{master_addr} resolves to loopback and this host has no other interface"
    raise EnvError(
        f"MASTER_ADDR={master_addr!r} resolves to loopback ({master_ips[0]}) on this host, so it is the "
        f"master, and it has several interfaces ({', '.join(ordinary)}): peers on other nodes could not reach "
        "a store bound to loopback and the right interface is ambiguous.", "give this host's name its real "
        "address in /etc/hosts (not 127.0.1.1), or set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME per node."
    )


def parse_ip_addr(output: str) -> list[IfAddr]:
    """Parse `ip -o addr show` output: `2: eth0    inet 198.18.0.11/24 brd ... scope global eth0`."""
    entries = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        name = fields[1].split("@", 1)[0]  # veth peers print as eth0@if12
        entries.append(IfAddr(name, fields[3].split("/", 1)[0]))
    return entries


def list_interfaces() -> list[IfAddr]:
    """This host's UP interfaces and their addresses: `ip -o addr show up`, else ioctl (IPv4)."""
    # Under --export=NONE (also inherited through SLURM_EXPORT_ENV) srun tasks get only SLURM_*
    # variables, no PATH (man srun, --export), so `ip` is also looked for where distros put it.
    ip = next((path for path in ("ip", *IP_PATHS) if shutil.which(path)), None)
    if ip is not None:
        result = subprocess.run([ip, "-o", "addr", "show", "up"], capture_output=True, text=True,
                                timeout=10, check=False)
        if result.returncode == 0:
            return parse_ip_addr(result.stdout)
        logger.debug("ip -o addr failed (%d): %s", result.returncode, result.stderr.strip())
    return _ioctl_interfaces()


def resolve(master_addr: str) -> list[str]:
    """The addresses master_addr resolves to, in resolver order; EnvError when it does not."""
    try:
        infos = socket.getaddrinfo(master_addr, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EnvError(
            f"MASTER_ADDR={master_addr!r} does not resolve on host {socket.gethostname()} ({exc}).",
            "use a host name of this job's node list (scontrol show hostnames $SLURM_JOB_NODELIST) "
            "or an IP address, and check /etc/hosts or DNS on every node."
        ) from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def source_address(ip: str) -> str | None:
    """The local address the kernel would send from to reach ip; None when unroutable.

    connect() on a UDP socket only picks the route; no packet leaves the host.
    """
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((ip, 9))
        except OSError:
            return None
        return str(sock.getsockname()[0]).split("%", 1)[0]


def own_addresses() -> list[str]:
    """What this host's own name resolves to (empty when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _holder(table: Sequence[IfAddr], address: str) -> IfAddr | None:
    wanted = ipaddress.ip_address(address.split("%", 1)[0])
    return next((entry for entry in table if ipaddress.ip_address(entry.address) == wanted), None)


def _is_local_name(master_addr: str) -> bool:
    if master_addr.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(master_addr.strip("[]")).is_loopback
    except ValueError:
        return False


def _virtual(name: str) -> bool:
    return name.startswith(VIRTUAL_PREFIXES)


def _describe(table: Sequence[IfAddr]) -> str:
    return ", ".join(f"{entry.name} {entry.address}" for entry in table) or "none"


def _ioctl_interfaces() -> list[IfAddr]:
    """IPv4 address of each UP interface via SIOCGIFFLAGS/SIOCGIFADDR (hosts without iproute2)."""
    entries = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)[16:18])[0]
                if not flags & _IFF_UP:
                    continue
                address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24])
            except OSError:  # no IPv4 address on this interface
                continue
            entries.append(IfAddr(name, address))
    return entries
