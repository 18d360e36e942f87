"""Which addresses stay on this machine: the one fact the server's authentication rules and the
client's refusal to send a bearer token in plaintext both turn on (README, "Who may call")."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

Resolver = Callable[[str], list[str]]


def _resolve(host: str) -> list[str]:
    try:
        return [str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except (OSError, UnicodeError):
        return []


def _host_is_loopback(host: str, resolve: Resolver) -> bool:
    host = host.strip("[]")
    if not host:
        return False  # ":PORT" binds every interface
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    addresses = resolve(host)
    return bool(addresses) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses)


def is_loopback(address: str, resolve: Resolver = _resolve) -> bool:
    """Whether every address the server would bind for `address` (HOST:PORT) is a loopback one.
    A name (`localhost`, a host name) counts by what it resolves to, as the bind does: a hosts
    file that maps `localhost` beyond the machine must not earn it loopback's trust."""
    return _host_is_loopback(address.rsplit(":", 1)[0], resolve)


def target_is_local(target: str, resolve: Resolver = _resolve) -> bool:
    """The same for a client's gRPC target: HOST:PORT, or with a scheme (`dns:///HOST:PORT`,
    `ipv4:A:PORT,B:PORT`, `ipv6:[A]:PORT`); a Unix socket (`unix:`, `unix-abstract:`) is local."""
    scheme, sep, rest = target.partition(":")
    if sep and scheme in ("unix", "unix-abstract"):
        return True
    if sep and scheme == "dns":
        rest = rest.removeprefix("//").partition("/")[2] if rest.startswith("//") else rest
        return is_loopback(rest, resolve)
    if sep and scheme in ("ipv4", "ipv6"):
        return all(is_loopback(one, resolve) for one in rest.split(","))
    return is_loopback(target, resolve)


WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def check_advertised(address: str) -> str:
    """`address` if it is HOST:PORT with a host and a port 1-65535 (what a client can dial), else
    ValueError saying what would do."""
    host, sep, port = address.rpartition(":")
    if not sep or host.strip("[]") in WILDCARD_HOSTS or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT that clients can dial (a host name or address, not a wildcard, and "
                         f"a port 1-65535), got {address!r}")
    return address


def advertised(bound: str, port: int, machine: str) -> str:
    """HOST:PORT a client reaches a server at that binds `bound` and got `port`: the bound host,
    or for a wildcard (every interface) the machine's name."""
    host = bound.rsplit(":", 1)[0]
    return f"{machine if host.strip('[]') in WILDCARD_HOSTS else host}:{port}"
