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


def parse_host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of HOST:PORT as every address setting reads it (the bind, advertised and
    metrics addresses), or None: a port of ASCII digits 0-65535, and an IPv6 host in brackets
    (`[::1]:50051`; bare, `::1:8080` is read one way here and another by a client). The host may
    be empty (every interface); whether that, or port 0, will do is the caller's rule."""
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        return None
    if host.startswith("[") or host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1] if host.startswith("[") and host.endswith("]") else "-")
        except ValueError:
            return None
    elif ":" in host or any(c.isspace() or c in "[]/" for c in host):
        return None
    return host, int(port)


def cannot_listen(address: str) -> str:
    """Why a server could not listen on `address` (HOST:PORT, checked already) now, or "": each of
    the host's addresses is tried as gRPC binds it (SO_REUSEADDR), and the port is taken when
    none can be bound, as gRPC then fails. Port 0 always can be. Asked before anything is opened,
    so that a port in use stops the start with its reason rather than gRPC's "Failed to bind"."""
    parsed = parse_host_port(address)
    if parsed is None or parsed[1] == 0:
        return ""
    host = parsed[0].strip("[]") or None
    try:
        infos = socket.getaddrinfo(host, parsed[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        return f"{parsed[0]} does not resolve ({getattr(exc, 'strerror', None) or exc})"
    reasons = []
    for family, kind, proto, _, where in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(where)
                return ""
            except OSError as exc:
                reasons.append(exc.strerror or str(exc))
    return reasons[0] if reasons else f"{parsed[0]} has no address to listen on"


def check_advertised(address: str) -> str:
    """`address` if it is HOST:PORT with a host and a port 1-65535 (what a client can dial), else
    ValueError saying what would do."""
    parsed = parse_host_port(address)
    if parsed is None or parsed[0].strip("[]") in WILDCARD_HOSTS or parsed[1] == 0:
        raise ValueError(f"must be HOST:PORT that clients can dial (a host name or address, not a wildcard, and "
                         f"a port 1-65535), got {address!r}")
    return address


def advertised(bound: str, port: int, machine: str) -> str:
    """HOST:PORT a client reaches a server at that binds `bound` and got `port`: the bound host,
    or for a wildcard (every interface) the machine's name."""
    host = bound.rsplit(":", 1)[0]
    return f"{machine if host.strip('[]') in WILDCARD_HOSTS else host}:{port}"
