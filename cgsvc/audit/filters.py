"""List filters in the AIP-160 style, the subset cgsvc supports:

    filter := group ( "AND" group )*
    group  := operand ( "OR" operand )*          (OR binds tighter than AND, as AIP-160 says)
    operand:= "NOT" operand | "(" filter ")" | term
    term   := FIELD OP VALUE | labels.KEY:*         OP := = | != | < | <= | > | >=
    VALUE  := "quoted string" | number | bare-word

Parsing yields a conjunction: each item a `Term`, or an `AnyOf` of terms joined by OR; the store
maps each term to SQL for its own columns (`alternatives` reads both alike). An AND group as one
side of OR (`(a AND b) OR c`) would need rewriting into that form and is refused, naming the
rewriting (`(a OR c) AND (b OR c)`). NOT is the opposite term (`NOT a < 3` is `a >= 3`, so it
means what != and the opposite comparisons mean), and of a group each term's opposite (De
Morgan's laws). Bad syntax or an
unknown field is a `FilterError` naming what would be valid. A filter is input like a spec: a
field whose values are a closed set (`Closed`: graph backends, launch states) matches them
case-insensitively and refuses any other value, naming the set; one with catalogued names
(`Catalogued`: GPUs, models by id or alias) compares a known name in the catalog's spelling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cgsvc.audit.records import utc_text
from cgsvc.errors import did_you_mean, one_spelling

# A word may hold colons (a time's) but not end in one: `labels.team:*` is a word, then has.
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>!=|<=|>=|=|<|>)|(?P<has>:\*)|(?P<paren>[()])'
                    r'|(?P<word>[A-Za-z0-9_.:+\-/]*[A-Za-z0-9_.+\-/]))')
OPS = ("=", "!=", "<", "<=", ">", ">=")
HAS = ":*"  # AIP-160's has, for a label's key alone: `labels.team:*`
NOT_HAS = "NOT :*"  # `NOT labels.team:*`: no label with that key


class FilterError(ValueError):
    """A filter that cannot be parsed or names an unknown field."""


class OrderError(ValueError):
    """An order_by this collection cannot be listed in."""


@dataclass(frozen=True)
class Order:
    """An AIP-132 order_by as read: by `field` ("": when the items were made, the order a
    collection is kept in), descending or not. Ties, and items with no value of `field` (after
    the rest, whichever way), go in the order they were made."""

    field: str = ""
    desc: bool = False


def parse_order(text: str, key: str, by: Sequence[str] = ()) -> Order:
    """AIP-132 `order_by` over when a collection's items were made (`key`: sequence, create_time):
    "", KEY or "KEY asc" is oldest first, "KEY desc" newest first; or over one of the fields `by`
    names, with asc or desc. Anything else is refused, naming what is valid."""
    words = text.lower().split()
    if not words:
        return Order()
    if words[0] in (key, *by) and len(words) <= 2 and words[1:] in ([], ["asc"], ["desc"]):
        return Order("" if words[0] == key else words[0], words[1:] == ["desc"])
    if by:
        started = [f for f in (key, *by) if f.startswith(words[0])]
        near = f"did you mean {started[0]!r}? " if started else did_you_mean(words[0], (key, *by))
        raise OrderError(f"{text[:60]!r}: {near}the order is by {key} or by one of {', '.join(by)}, "
                         "then asc or desc (those without one last)")
    raise OrderError(f"{text[:60]!r}: results are ordered by {key} only; give {key!r} (oldest first, the default) "
                     f"or '{key} desc' (newest first)")


@dataclass(frozen=True)
class Term:
    field: str
    op: str
    value: str | int | float
    also: tuple[str, ...] = ()  # other spellings `=` matches and `!=` excludes (Catalogued: as typed)
    prefix: bool = False  # `value*`: a value that starts with `value` (= and != only)
    fold: bool = False  # the prefix in any case (a catalogued name's: models, GPUs)


@dataclass(frozen=True)
class AnyOf:
    """Terms joined by OR: a row matches when any of them does."""

    terms: tuple[Term, ...]


Condition = Term | AnyOf  # one item of a parsed filter, all of which a row must match


def alternatives(condition: Condition) -> tuple[Term, ...]:
    """The terms a row may match to match `condition` (a Term alone is one)."""
    return condition.terms if isinstance(condition, AnyOf) else (condition,)


@dataclass(frozen=True)
class Closed:
    """A string field whose every value is one of `choices`, stored in that spelling; `aliases`
    (lower case) are other names of a choice that a request may give it by (bf16: bfloat16)."""

    choices: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Catalogued:
    """A string field of names a catalog spells one way (`lookup`: that spelling, None for a name
    it does not know). Records keep known names in that spelling, but a name given only as a label
    (a spec's model.name beside model.path) is kept as written, so a term matches both."""

    lookup: Callable[[str], str | None]


@dataclass(frozen=True)
class Named:
    """A field holding a resource of `collection` (`plan = "plans/ID"`): its name or the bare ID
    (or "" for none) is read as the ID; a name of another collection is refused, as it could
    match nothing."""

    collection: str


# "str", "int", "number" (a finite decimal: a measure), "time", "labels" (labels.KEY), or one of these
FieldKind = str | Closed | Catalogued | Named

# A label (a launch's caller-given name, `labels.KEY = VALUE`): what a key and a value may hold.
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
LABEL_FORM = "1 to 63 lower-case letters, digits, _ or -, starting with a lower-case letter"


def label_problem(key: str, value: str) -> str:
    """What is wrong with a label, or "" (keys: LABEL_FORM; values: up to 63 of the same)."""
    if not LABEL_KEY.fullmatch(key):
        return f"a label key is {LABEL_FORM}; got {key[:70]!r}"
    if not LABEL_VALUE.fullmatch(value):
        return f"a label value is up to 63 lower-case letters, digits, _ or -; got {value[:70]!r}"
    return ""


def delimited(items: Iterable[str]) -> str:
    """A delimited cell (labels, plans, substituted fields): each item between commas, ",a,b,"
    ("," for none), so that an item is matched whole, comma to comma (`_listed` in the launch
    store reads it)."""
    return ",".join(["", *items, ""])


def labels_cell(labels: Mapping[str, str]) -> str:
    """Labels as a labels column keeps them (launches', experiments'): each key=value between
    commas, by key; "" for none."""
    return delimited(f"{k}={labels[k]}" for k in sorted(labels)) if labels else ""


def labels_text(labels: Mapping[str, str]) -> str:
    """Labels as people read them, by key: "team=infra, ticket=inc-42" ("" for none)."""
    return ", ".join(f"{k}={labels[k]}" for k in sorted(labels))


def labels_of(cell: str) -> dict[str, str]:
    """A labels column's cell back as a mapping (labels_cell's inverse)."""
    return dict(pair.split("=", 1) for pair in cell.strip(",").split(",")) if cell.strip(",") else {}


TIME_FORM = "an RFC 3339 time with an offset (2026-12-06T08:00:00Z)"


def utc_time(text: str) -> str | None:
    """An RFC 3339 time with an offset as the services write times (UTC, microseconds, which
    sorts as text), or None for anything else (a time with no offset names no moment)."""
    moment = None
    with contextlib.suppress(ValueError):
        moment = dt.datetime.fromisoformat(text.strip()) if len(text) <= 64 else None
    if moment is None or moment.tzinfo is None:
        return None
    return utc_text(moment)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterError(f"unexpected character at position {pos}: {text[pos:pos + 10]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


# A filter is a WHERE clause; SQLite refuses an expression over 1,000 deep (an INTERNAL error
# after seconds of work, before this cap), and no real question needs more.
MAX_TERMS = 64


def _spelled(name: str, value: str, kind: Closed | Catalogued) -> tuple[str, tuple[str, ...]]:
    """A string value of a closed or catalogued field: its one spelling, and the other spellings
    that match too."""
    if isinstance(kind, Closed):
        canonical = one_spelling(kind.aliases.get(value.lower(), value), kind.choices)
        if canonical is None:
            also = f" (or {', '.join(kind.aliases)})" if kind.aliases else ""
            raise FilterError(f"{name}: unknown value {value[:40]!r}; {did_you_mean(value, kind.choices)}valid: "
                              f"{', '.join(kind.choices)}{also}")
        return canonical, ()
    known = kind.lookup(value) if len(value) <= 200 else None
    return (known, (value,)) if known is not None and known != value else (value, ())


def _number(name: str, text: str) -> float:
    """A measure's value: a finite decimal (what NaN or infinity would ask cannot be answered)."""
    number: float | None = None
    with contextlib.suppress(ValueError):
        number = float(text) if len(text) <= 40 else None
    if number is None or not math.isfinite(number):
        raise FilterError(f"{name} takes a number (such as 200 or 12.5), got {text[:40]!r}")
    return number


def _id_in(name: str, value: str, collection: str) -> str:
    """The ID a Named field's value names: `collection/ID`, or the bare ID."""
    ident = value.removeprefix(f"{collection}/")
    if "/" in ident or (not ident and value):
        raise FilterError(f"{name} takes {collection}/ID or the bare ID, got {value[:80]!r}")
    return ident


MAX_DEPTH = 8  # parentheses and NOTs inside each other


def parse_filter(text: str, fields: Mapping[str, FieldKind]) -> list[Condition]:
    """Parse `text` against `fields` (name -> "str" | "int" | "time" | Closed | Catalogued | ...):
    the conditions a row must all match; empty text is no filter."""
    if not text.strip():
        return []
    parser = _Parser(_tokens(text), fields)
    groups = parser.conjunction(0)
    if parser.i < len(parser.toks):
        raise FilterError("a ) with no ( before it") if parser.at("paren", ")") else parser.unexpected(inside=False)
    return [group[0] if len(group) == 1 else AnyOf(group) for group in groups]


class _Parser:
    """Recursive descent over the tokens, into groups of alternatives (a conjunction)."""

    def __init__(self, toks: list[tuple[str, str]], fields: Mapping[str, FieldKind]) -> None:
        self.toks, self.fields, self.i, self.terms = toks, fields, 0, 0

    def at(self, kind: str, text: str) -> bool:
        return self.i < len(self.toks) and self.toks[self.i] == (kind, text)

    def unexpected(self, inside: bool) -> FilterError:
        """The token where a joiner (or, `inside` parentheses, their end) was due."""
        kind, got = self.toks[self.i]
        if kind == "word" and got.upper() in ("AND", "OR", "NOT"):
            return FilterError(f"AND, OR and NOT are upper case; got {got!r}")
        closing = ", or ) to close the (" if inside else ""
        return FilterError(f"expected AND or OR between terms{closing}, got {got[:40]!r}")

    def conjunction(self, depth: int) -> list[tuple[Term, ...]]:
        groups = self.disjunction(depth)
        while self.at("word", "AND"):
            self.i += 1
            groups += self.disjunction(depth)
        return groups

    def disjunction(self, depth: int) -> list[tuple[Term, ...]]:
        sides = [self.operand(depth)]
        while self.at("word", "OR"):
            self.i += 1
            sides.append(self.operand(depth))
        if len(sides) == 1:
            return sides[0]
        if any(len(side) != 1 for side in sides):
            raise FilterError("a group joined by AND cannot be one side of OR; write (a AND b) OR c as "
                              "(a OR c) AND (b OR c)")
        return [tuple(term for side in sides for term in side[0])]

    def operand(self, depth: int) -> list[tuple[Term, ...]]:
        """A term (one group of one), or a parenthesised filter (its groups)."""
        if self.at("paren", "("):
            if depth == MAX_DEPTH:
                raise FilterError(f"NOT and parentheses nest at most {MAX_DEPTH} deep")
            self.i += 1
            groups = self.conjunction(depth + 1)
            if not self.at("paren", ")"):
                if self.i < len(self.toks):
                    raise self.unexpected(inside=True)
                raise FilterError("expected ) to close the (")
            self.i += 1
            return groups
        if self.at("word", "NOT"):
            if depth == MAX_DEPTH:
                raise FilterError(f"NOT and parentheses nest at most {MAX_DEPTH} deep")
            self.i += 1
            return _negated(self.operand(depth + 1))
        toks = self.toks[self.i:self.i + 3]
        if len(toks) >= 2 and toks[1][0] == "has":
            term = _has(toks[0], self.fields)
            self.i += 2
        else:
            term = _term(toks, self.fields)
            self.i += 3
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise FilterError(f"at most {MAX_TERMS} terms, joined by AND or OR")
        return [(term,)]


_OPPOSITE = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">", HAS: NOT_HAS, NOT_HAS: HAS}


def _negated(groups: list[tuple[Term, ...]]) -> list[tuple[Term, ...]]:
    """NOT of a conjunction of alternatives, as one (De Morgan): NOT (a OR b) is NOT a AND NOT
    b; NOT (a AND b) is NOT a OR NOT b; NOT of a term, the opposite term."""
    def opposite(t: Term) -> Term:
        return dataclasses.replace(t, op=_OPPOSITE[t.op])

    if len(groups) == 1:
        return [(opposite(t),) for t in groups[0]]
    if all(len(group) == 1 for group in groups):
        return [tuple(opposite(group[0]) for group in groups)]
    raise FilterError("NOT of a group joined by both AND and OR is not supported; NOT ((a OR b) AND c) is "
                      "(NOT a OR NOT c) AND (NOT b OR NOT c)")


def _prefix(name: str, op: str, value: str, kind: FieldKind) -> Term:
    """`FIELD = "text*"`: a text field's values that start with `text` (AIP-160's wildcard, at the
    end only); a catalogued name's in any case, as the catalog matches names."""
    if kind not in ("str", "labels") and not isinstance(kind, Catalogued):
        raise FilterError(f"{name}: a prefix (*) applies to text fields only (principal, model, labels.KEY, ...), "
                          f"got {value[:40]!r}")
    if value.count("*") != 1 or not value.endswith("*"):
        raise FilterError(f"{name}: a * may only end a value (a prefix: \"ci-*\"), got {value[:40]!r}")
    if op not in ("=", "!="):
        raise FilterError(f"{name}: a prefix (*) takes = or !=, got {op}")
    start = value[:-1]
    if kind == "labels" and (problem := label_problem(name.removeprefix("labels."), start)):
        raise FilterError(f"{name}: {problem}")
    return Term(name, op, start, prefix=True, fold=isinstance(kind, Catalogued))


def _has(tok: tuple[str, str], fields: Mapping[str, FieldKind]) -> Term:
    """`labels.KEY:*`: a label with that key, whatever its value."""
    kind, name = tok
    if kind != "word" or not name.startswith("labels.") or fields.get("labels") != "labels":
        raise FilterError(f"{HAS} (has) applies to labels.KEY only (`labels.team:*`), got {name[:80]!r}:*")
    if problem := label_problem(name.removeprefix("labels."), ""):
        raise FilterError(f"{name}: {problem}")
    return Term(name, HAS, "")


def _term(toks: list[tuple[str, str]], fields: Mapping[str, FieldKind]) -> Term:
    """FIELD OP VALUE, its value read as the field's kind."""
    if len(toks) < 3:
        raise FilterError("expected FIELD OP VALUE, e.g. model = \"deepseek-ai/DeepSeek-V3\"")
    (k1, name), (k2, op), (k3, raw) = toks
    kind = fields.get(name) if name != "labels" else None
    if kind is None and name.startswith("labels.") and fields.get("labels") == "labels":
        kind = "labels"
    if k1 != "word" or kind is None:
        known = sorted("labels.KEY" if f == "labels" else f for f in fields)
        started = [f for f in known if f.startswith(name) and name] if k1 == "word" else []
        near = f"did you mean {started[0]!r}? " if started else did_you_mean(name, known)
        raise FilterError(f"unknown field {name[:60]!r}; {near}filterable fields: {', '.join(known)}")
    if k2 != "op":
        raise FilterError(f"expected an operator after {name!r}; one of {' '.join(OPS)}, or {HAS} after labels.KEY")
    if k3 not in ("str", "word"):
        raise FilterError(f"expected a value after {name} {op}")
    value: str | int | float = raw[1:-1].replace('\\"', '"') if k3 == "str" else raw
    if "*" in str(value):
        return _prefix(name, op, str(value), kind)
    if kind == "labels":
        if problem := label_problem(name.removeprefix("labels."), str(value)):
            raise FilterError(f"{name}: {problem}")
    elif fields[name] == "int":
        number: int | None = None
        with contextlib.suppress(ValueError):
            number = int(value) if len(str(value)) <= 20 else None
        if number is None or not -(1 << 63) <= number < 1 << 63:
            raise FilterError(f"{name} takes an integer from -2^63 to 2^63-1, got {str(value)[:40]!r}")
        value = number
    elif fields[name] == "number":
        value = _number(name, str(value))
    elif fields[name] == "time":  # a moment, compared as the stored UTC text sorts
        if (moment := utc_time(str(value))) is None:
            raise FilterError(f"{name}: {TIME_FORM}; got {str(value)[:40]!r}")
        value = moment
    elif isinstance(kind, Named):
        value = _id_in(name, str(value), kind.collection)
    also: tuple[str, ...] = ()
    if isinstance(kind, Closed | Catalogued):
        value, also = _spelled(name, str(value), kind)
    return Term(name, op, value, also)
