"""`cgsvc token ...`: the token file's commands, run where the file lives (no server needed).

    cgsvc token new --principal P --role R [--expires T] [--append FILE]   a random token and its entry
    cgsvc token revoke --file FILE (--principal P | --sha256 HEX | --token -)   remove entries
    cgsvc token check FILE [-o json]   check a file as `serve` would; list who it admits
    cgsvc token hash [TOKEN]           the SHA-256 a token file holds (reads stdin without TOKEN)

A file is changed only whole: the new text is checked as `serve` loads it, then written with
cgsvc.files.write_atomically, so a server reloading meanwhile (SIGHUP, --credentials-poll-seconds)
reads the old file or the new one, never half of one. The format is in cgsvc/server/auth.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import secrets
import stat
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.files import write_atomically
from cgsvc.server.auth import ROLES, Principal, TokenFileError, hash_token, load_token_file
from cgsvc.text import counted

NO_ROLES = "it is authenticated but may call no cgsvc method (health and reflection need no token)"
EXPIRY_WARNING_DAYS = 7
MAX_DAYS = 36500  # --expires-in-days: a token for longer is one without --expires


def token_warnings(tokens: dict[str, Principal], certificates: dict[str, Principal], now: float) -> list[str]:
    """What a token file admits that is likely a mistake or about to bite: a principal with no
    roles (a typo, or an account switched off by hand: either way it can call nothing of
    cgsvc's), a token already expired, one that expires within EXPIRY_WARNING_DAYS."""
    out = sorted({f"token principal {p.name!r} has no roles: {NO_ROLES}" for p in tokens.values() if not p.roles}
                 | {f"certificate {cn!r} has no roles: {NO_ROLES}" for cn, p in certificates.items() if not p.roles})
    for p in sorted(tokens.values(), key=lambda p: (p.name, p.expires)):
        if p.expires and p.expires <= now:
            out.append(f"a token of principal {p.name!r} expired at {p.expiry()}: it is refused")
        elif p.expires and p.expires - now < EXPIRY_WARNING_DAYS * 86400:
            out.append(f"a token of principal {p.name!r} expires at {p.expiry()}, in "
                       f"{(p.expires - now) / 86400:.1f} days")
    return out


def check(path: str, output: str) -> int:
    """Exit 0 and list the file's principals, or exit 2 naming the entry `serve` would refuse."""
    import cgsvc_client.render as render  # the CLI's renderer; imported where used, as the server never needs it

    try:
        tokens, certificates = load_token_file(path)
    except TokenFileError as exc:  # "token_file PATH: where: what"
        return refuse(output, "token_file", str(exc).removeprefix("token_file "))
    rows = ([{"kind": "token", "principal": p.name, "roles": list(p.roles), "sha256": digest, "expires": p.expiry()}
             for digest, p in tokens.items()]
            + [{"kind": "certificate", "principal": p.name, "roles": list(p.roles), "sha256": "", "expires": ""}
               for p in certificates.values()])
    warnings = token_warnings(tokens, certificates, time.time())
    if output == "json":
        render.print_json({"token_file": path, "principals": rows, "warnings": warnings})
        return 0
    print(render.table(["kind", "principal", "roles", "sha256", "expires"],
                       [(r["kind"], r["principal"], ",".join(r["roles"]) or "-", r["sha256"][:16] or "-",
                         r["expires"] or "-") for r in rows]))
    print(f"{path}: {render.counted(len(tokens), 'token')}, {render.counted(len(certificates), 'certificate name')}")
    for warning in warnings:
        print(f"WARNING: {warning}")
    return 0


TOKEN_PREFIX = "cgsvc_"  # so that secret scanners and a reader can tell a cgsvc token at sight


def new(ns: argparse.Namespace) -> int:
    """`cgsvc token new`: a random bearer token (256 bits) printed alone on stdout, once, and the
    token-file entry that admits it (its SHA-256, never the token) on stderr, or added to the file
    with --append. Exit 2 naming the field for bad input; the file is then left as it was."""
    import cgsvc_client.render as render

    name = ns.principal
    if not name.strip() or not name.isprintable():
        return refuse(ns.output, "principal", f"a non-empty name of printable characters (every audit record of its calls "
                                   f"names it); got {name!r}")
    expires: dt.datetime | None = None
    if ns.expires_in_days is not None:
        if ns.expires:
            return refuse(ns.output, "expires", "give --expires or --expires-in-days, not both")
        if not 0 < ns.expires_in_days <= MAX_DAYS:  # NaN too; a date past year 9999 has no ISO form
            return refuse(ns.output, "expires_in_days", f"must be more than 0 days and at most {MAX_DAYS} (100 years), "
                                                        f"got {ns.expires_in_days:g}")
        expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=ns.expires_in_days)
    elif ns.expires:
        try:
            expires = dt.datetime.fromisoformat(ns.expires)
        except ValueError:
            expires = None
        if expires is None or expires.tzinfo is None:
            return refuse(ns.output, "expires", f"a date-time with an offset, e.g. 2027-01-31T00:00:00Z; got {ns.expires!r}")
        if expires.timestamp() <= time.time():
            return refuse(ns.output, "expires", f"{ns.expires} has passed: the token would be refused from the start")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    roles = list(dict.fromkeys(ns.role))
    entry = entry_text("tokens", {"principal": name, "roles": roles, "sha256": hash_token(secret),
                                  **({"expires": expires} if expires else {})})
    if ns.append:
        try:
            target = Path(ns.append).resolve()
            old = target.read_text(encoding="utf-8") if target.exists() else ""
            try:
                data: dict[str, Any] | None = tomllib.loads(old)
            except tomllib.TOMLDecodeError:  # write_file refuses it, naming the file, as `serve` would
                data = None
            if data is not None and in_another_form(data, token_tables(old)):
                if not ns.rewrite:
                    return refuse(ns.output, "append", f"{ns.append} lists tokens other than as [[tokens]] tables (an "
                                                        f"inline array), to which a table cannot be added: {REWRITE}")
                write_file(ns.append, as_tables(data) + "\n" + entry)
            else:
                append_entry(ns.append, entry, old)
        except TokenFileError as exc:
            return refuse(ns.output, "append", f"{exc}; nothing was written")
        except OSError as exc:
            return refuse(ns.output, "append", f"{ns.append}: {exc.strerror or exc}; nothing was written")
    try:
        if ns.output == "json":
            render.print_json({"token": {"token": secret, "principal": name, "roles": roles,
                                         "sha256": hash_token(secret), "expires": expires.isoformat() if expires else "",
                                         "entry": entry, "appended_to": ns.append or ""}})
        else:
            print(secret)
        sys.stdout.flush()
    except BrokenPipeError:  # the token reached nobody
        render.stdout_closed()
        undo = (f"; {ns.append} now admits a token nobody holds: cgsvc token revoke --file {ns.append} --sha256 "
                f"{hash_token(secret)[:16]}" if ns.append else "")
        print(f"cgsvc: the token could not be printed (standard output was closed){undo}", file=sys.stderr)
        return 1
    if ns.output == "json":
        return 0
    if ns.append:
        print(f"appended principal {name!r} ({', '.join(roles)}) to {ns.append}: a server admits it after "
              "`kill -HUP` or at its next --credentials-poll-seconds check", file=sys.stderr)
    else:
        print(f"the token is printed once, above; the token file holds only its hash:\n\n{entry}", file=sys.stderr)
    return 0


def entry_text(table: str, entry: dict[str, Any]) -> str:
    """One token-file entry as a TOML table of `table` ("tokens" or "certificates"): strings and
    lists as JSON writes them (valid TOML), a date-time unquoted, as TOML has it."""
    return "\n".join([f"[[{table}]]", *(f"{key} = {value.isoformat() if isinstance(value, dt.datetime) else json.dumps(value, ensure_ascii=False)}"
                                        for key, value in entry.items())]) + "\n"


def token_tables(text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """The file cut as _entries cuts it, each piece with the one token its [[tokens]] table holds
    (None for any other piece: the preamble, a [[certificates]] table)."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for piece in _entries(text):
        listed = tomllib.loads(piece).get("tokens", []) if HEADER.match(piece) else []
        out.append((piece, listed[0] if len(listed) == 1 else None))
    return out


def in_another_form(data: dict[str, Any], tables: list[tuple[str, dict[str, Any] | None]]) -> bool:
    """Whether a token file (`data` parsed, `tables` as token_tables cuts it) lists tokens other
    than as [[tokens]] tables (an inline array), so that its entries cannot be cut out or added
    to one table at a time."""
    listed = data.get("tokens", [])
    return sum(1 for _, token in tables if token is not None) != (len(listed) if isinstance(listed, list) else 0)


def as_tables(data: dict[str, Any], leave_out: Callable[[dict[str, Any]], bool] = lambda entry: False) -> str:
    """A token file's entries (`data` parsed) written anew as [[tokens]] and [[certificates]]
    tables, those that `leave_out` picks left out (its comments and layout are not kept)."""
    return "\n".join([*(entry_text("tokens", e) for e in data.get("tokens", []) if not leave_out(e)),
                      *(entry_text("certificates", e) for e in data.get("certificates", []))])


REWRITE = ("give --rewrite to write it anew as [[tokens]] and [[certificates]] tables (its comments and layout are "
           "not kept), or edit it by hand")


def append_entry(path: str, entry: str, old: str) -> None:
    """Add `entry` to the token file at `path`, which holds `old` (write_file: made when absent,
    checked whole)."""
    blank_line = "\n" if old.endswith("\n") else "\n\n"  # between the entries
    write_file(path, old + blank_line + entry if old.strip() else entry)


def refuse(output: str, field: str, message: str) -> int:
    """Bad input: exit 2 naming the field, as JSON under -o json."""
    import cgsvc_client.render as render

    if output == "json":
        render.print_json({"error": ServiceError.invalid([FieldViolation(field, message)]).to_dict()})
    else:
        print(f"cgsvc: {field}: {message}", file=sys.stderr)
    return 2


def write_file(path: str, text: str) -> None:
    """Replace the token file at `path` with `text` (made with mode 0600 when absent) only if the
    text loads as `serve` loads it (TokenFileError otherwise, nothing written)."""
    load_token_file(path, text)
    target = Path(path).resolve()
    write_atomically(target, text, stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o600)


HEADER = re.compile(r"^\s*\[")  # a table or array-of-tables header starts an entry


def _entries(text: str) -> list[str]:
    """The file cut before each table header: the preamble, then one piece per entry (its
    header, keys, and the comments and blank lines that follow it)."""
    pieces: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if HEADER.match(line) and current:
            pieces.append("".join(current))
            current = []
        current.append(line)
    if current:
        pieces.append("".join(current))
    return pieces


def revoke(ns: argparse.Namespace) -> int:
    """`cgsvc token revoke`: remove the [[tokens]] entries of a principal, of a token's hash (or
    a prefix of it naming one entry), or of a token read from stdin; exit 2 naming why when none
    (or, for a prefix, more than one) matches, the file untouched."""
    chosen = [k for k in ("principal", "sha256", "token") if getattr(ns, k) is not None]
    if len(chosen) != 1:
        return refuse(ns.output, "principal", "give one of --principal NAME, --sha256 HEX or --token - (the token on stdin)")
    try:
        text = Path(ns.file).read_text(encoding="utf-8")
        tokens, _ = load_token_file(ns.file, text)
    except TokenFileError as exc:
        return refuse(ns.output, "file", str(exc))
    except OSError as exc:
        return refuse(ns.output, "file", f"{ns.file}: {exc.strerror or exc}")
    if ns.token is not None:
        if ns.token != "-":
            return refuse(ns.output, "token", "give - and the token on stdin: a token on the command line stays in the "
                                        "shell's history and the process list")
        wanted = hash_token(sys.stdin.readline().strip())

        def matches(entry: dict[str, Any]) -> bool:
            return str(entry.get("sha256", "")).lower() == wanted
    elif ns.sha256 is not None:
        prefix = ns.sha256.strip().lower()
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            return refuse(ns.output, "sha256", f"8 to 64 hex digits of the token's SHA-256 (cgsvc token check lists them); "
                                         f"got {ns.sha256!r}")
        found = sorted(d for d in tokens if d.startswith(prefix))
        if len(found) > 1:
            return refuse(ns.output, "sha256", f"{prefix} names {len(found)} tokens ({', '.join(tokens[d].name for d in found)}): "
                                         "give more digits")

        def matches(entry: dict[str, Any]) -> bool:
            return str(entry.get("sha256", "")).lower().startswith(prefix)
    else:
        def matches(entry: dict[str, Any]) -> bool:
            return entry.get("principal") == ns.principal

    data = tomllib.loads(text)
    removed = [e for e in data.get("tokens", []) if matches(e)]
    if not removed:
        which = {"principal": f"principal {ns.principal!r}", "sha256": f"sha256 {ns.sha256}",
                 "token": "that token"}[chosen[0]]
        return refuse(ns.output, chosen[0], f"no token of {which} in {ns.file}; nothing was changed")
    tables = token_tables(text)
    rewritten = in_another_form(data, tables)
    if rewritten and not ns.rewrite:
        return refuse(ns.output, "file", f"{ns.file} lists tokens other than as [[tokens]] tables (an inline array): "
                                          + REWRITE)
    if rewritten:  # every entry anew, as tables, the revoked ones left out
        kept = [as_tables(data, matches)]
    else:  # the revoked tables cut out, the rest of the file as it was
        kept = [piece for piece, token in tables if token is None or not matches(token)]
    remaining, _ = load_token_file(ns.file, "".join(kept))
    try:
        write_file(ns.file, "".join(kept))
    except TokenFileError as exc:
        return refuse(ns.output, "file", f"{exc}; nothing was changed")
    except OSError as exc:
        return refuse(ns.output, "file", f"{ns.file}: {exc.strerror or exc}; nothing was changed")
    gone = [{"principal": e["principal"], "sha256": str(e["sha256"]).lower(), "roles": e.get("roles", [])}
            for e in removed]
    if ns.output == "json":
        import cgsvc_client.render as render

        render.print_json({"revoked": gone, "token_file": ns.file, "tokens_left": len(remaining),
                           "rewritten": rewritten})
    else:
        for g in gone:
            print(f"revoked a token of principal {g['principal']!r} (sha256 {g['sha256'][:16]}...)")
        if rewritten:
            print(f"{ns.file} was written anew as [[tokens]] and [[certificates]] tables (its comments were not kept)")
        print(f"{ns.file}: {counted(len(remaining), 'token')} left; a server refuses the revoked ones after `kill -HUP` or at "
              "its next --credentials-poll-seconds check")
    return 0


def register(sub: Any) -> None:
    """The `token` command and its subcommands."""
    t = sub.add_parser("token", help="token file helpers: new, revoke, check, hash")
    tsub = t.add_subparsers(dest="token_command", required=True)
    n = tsub.add_parser("new", help="make a random bearer token for a principal: the token alone on stdout "
                                     "(once), its token-file entry on stderr or added to a file with --append")
    n.add_argument("--principal", required=True, help="who the token's calls are audited as, e.g. ci-bot")
    n.add_argument("--role", action="append", required=True, choices=ROLES,
                   help="a role it holds (give it again for several): " + ", ".join(ROLES))
    n.add_argument("--expires", metavar="DATETIME", help="refused from then on, e.g. 2027-01-31T00:00:00Z")
    n.add_argument("--expires-in-days", type=float, metavar="DAYS", help="refused from this many days from now")
    n.add_argument("--append", metavar="FILE", help="add the entry to this token file (made, mode 0600, when "
                   "absent), only if the whole file then passes `cgsvc token check`")
    n.add_argument("--rewrite", action="store_true", help="with --append, for a file that lists tokens in another "
                   "TOML form (an inline array): write it anew as tables (its comments and layout are not kept)")
    r = tsub.add_parser("revoke", help="remove tokens from a token file: a principal's, one by its hash, or one "
                                        "read from stdin")
    r.add_argument("--file", required=True, help="the token file")
    r.add_argument("--principal", help="every token of this principal")
    r.add_argument("--sha256", metavar="HEX", help="the token with this SHA-256 (8 or more leading hex digits "
                                                   "that name one entry)")
    r.add_argument("--token", metavar="-", help="- : the token itself, read from stdin (a leaked token you hold)")
    r.add_argument("--rewrite", action="store_true", help="for a file that lists tokens in another TOML form (an "
                   "inline array): write it anew as tables (its comments and layout are not kept)")
    c = tsub.add_parser("check", help="check a token file as `serve` would, and list who it admits")
    c.add_argument("file", help="the token file (TOML: [[tokens]] and [[certificates]])")
    h = tsub.add_parser("hash", help="print the SHA-256 of a token for the token file")
    h.add_argument("token", nargs="?", help="the token (read from stdin when absent)")
    for p, default_help in ((n, "table (default: the token on stdout, the entry on stderr) or json"),
                            (r, "table (default) or json"), (c, "table (default) or json")):
        p.add_argument("-o", "--output", choices=("table", "json"), default="table", help=default_help)


def run(ns: argparse.Namespace) -> int:
    """One token command; a reader that closes the pipe early (`| head`) ends it quietly."""
    try:
        code = _run(ns)
        sys.stdout.flush()
    except BrokenPipeError:
        import cgsvc_client.render as render  # the CLI's renderer, as check and new use it

        render.stdout_closed()
        return 0
    return code


def _run(ns: argparse.Namespace) -> int:
    if ns.token_command == "check":
        return check(ns.file, ns.output)
    if ns.token_command == "new":
        return new(ns)
    if ns.token_command == "revoke":
        return revoke(ns)
    token = (ns.token if ns.token is not None else sys.stdin.readline()).strip()
    if not token:
        return refuse("table", "token", "empty: give the token as the argument or on standard input "
                                         "(an empty token is never a credential)")
    print(hash_token(token))
    return 0

