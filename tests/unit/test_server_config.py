"""Server configuration precedence and errors; auth tables; filters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cgsvc.audit.filters import FilterError, Term, parse_filter
from cgsvc.audit.records import mask_secrets
from cgsvc.server.addresses import advertised, check_advertised, is_loopback, target_is_local
from cgsvc.server.auth import Authenticator, AuthError, TokenFileError, hash_token
from cgsvc.server.config import load_config


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "cgsvc.toml"
    f.write_text('[server]\naddress = "127.0.0.1:7000"\nmax_message_bytes = 100000\nallow_insecure_remote = true\n')
    cfg = load_config(str(f), env={"CGSVC_MAX_MESSAGE_BYTES": "200000", "CGSVC_DATA_DIR": "/tmp/x"},
                      overrides={"data_dir": "/tmp/y", "address": None})
    assert cfg.address == "127.0.0.1:7000" and cfg.max_message_bytes == 200000 and cfg.data_dir == "/tmp/y"
    assert cfg.allow_insecure_remote is True
    assert cfg.effective_database_url == "sqlite:////tmp/y/cgsvc.db"
    f.write_text('[server]\nadress = "x"\n')
    with pytest.raises(ValueError, match="unknown keys \\['adress'\\]"):
        load_config(str(f), env={})
    for body, names in (("[server\n", "not TOML"), ('server = "x"\n', "server must be a table")):
        f.write_text(body)  # the file is named, and what is wrong with it
        with pytest.raises(ValueError, match=f"^{f}: {names}"):
            load_config(str(f), env={})
    with pytest.raises(ValueError, match="CGSVC_MAX_MESSAGE_BYTES: max_message_bytes must be a int"):
        load_config(None, env={"CGSVC_MAX_MESSAGE_BYTES": "lots"})


def test_an_address_grpc_cannot_bind_as_given_is_refused_when_loaded() -> None:
    for bad in ("nonsense", "127.0.0.1:99999", "127.0.0.1:", "::1:50051", "127.0.0.1:port"):
        with pytest.raises(ValueError, match=r"^address must be HOST:PORT \(port 0-65535"):
            load_config(env={}, overrides={"address": bad})
    for good in ("127.0.0.1:0", "[::1]:50051", "0.0.0.0:50051", ":50051", "localhost:65535"):
        assert load_config(env={}, overrides={"address": good}).address == good


@pytest.mark.parametrize(("name", "value", "valid"), [
    ("lease_seconds", -1, "more than 0"), ("unfollowed_group_seconds", -1, "0 (never) or more"),
    ("credentials_poll_seconds", -1, "0 (only on SIGHUP) or more"), ("audit_cohort_wait_ms", -1, "0 or more"),
    ("audit_cohort_gap_ms", -1, "0 or more"), ("shutdown_grace_seconds", -1, "0 or more"),
    ("audit_max_batch", 0, "at least 1"), ("max_concurrent_rpcs", 0, "at least 1"), ("local_slots", 0, "from 1 to 1024"),
    ("ray_slots", 0, "from 1 to 65536"), ("max_message_bytes", 1000, "at least 65536 (64 KiB; a plan's answer alone is several KiB)"),
    # regression: past gRPC's 32-bit options the start ended in OverflowError while `serve --check` said it
    # would start; 10**11 CPU slots hung the start making them; an infinite lease or grace was taken
    ("max_message_bytes", 2**31, "at most 2147483647 (settings are 32-bit numbers, as gRPC's are)"),
    ("max_concurrent_rpcs", 10**14, "at most 2147483647 (settings are 32-bit numbers, as gRPC's are)"),
    ("audit_max_batch", 2**31, "at most 2147483647 (settings are 32-bit numbers, as gRPC's are)"),
    ("local_slots", 10**11, "from 1 to 1024"), ("ray_slots", 65537, "from 1 to 65536"),
    ("lease_seconds", float("inf"), "a finite number"), ("credentials_poll_seconds", float("inf"), "a finite number"),
    ("shutdown_grace_seconds", float("nan"), "a finite number"), ("audit_cohort_wait_ms", float("inf"), "a finite number"),
    ("audit_writer", "fork", "process or thread"), ("event_loop", "tokio", "one of auto, uvloop, asyncio"),
    ("log_level", "loud", "one of debug, info, warning, error"),
    ("launch_retention_days", -1, "0 (kept for ever) or more, at most 36500"),
    ("launch_retention_days", 10**6, "0 (kept for ever) or more, at most 36500"),
    ("launch_retention_days", float("inf"), "a finite number"),
])
def test_every_bounded_setting_is_checked_when_loaded(name: str, value: object, valid: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be {re.escape(valid)}, got "):
        load_config(env={}, overrides={name: value})
    load_config(env={}, overrides={"log_level": "WARNING", "audit_max_batch": 1, "max_message_bytes": 65536})


def test_a_database_url_the_store_cannot_keep_a_log_in_is_refused_when_loaded() -> None:
    """Regression: `--database-url mysql://a/b` (or `bogus`, `sqlite://`) reached SQLAlchemy
    and ended `serve` and `serve --check` in a traceback (No module named 'MySQLdb'); an
    in-memory SQLite log started, and was lost at exit. Each is refused by name, with the forms
    that work; the spellings of PostgreSQL that libpq and hosted databases give are taken."""
    valid = "valid: sqlite:///PATH, postgresql+psycopg://USER@HOST:PORT/DB"
    for bad, why in (("mysql://a/b", "mysql is not a database cgsvc keeps its log in"),
                     ("oracle://x", "oracle is not a database cgsvc keeps its log in"),
                     ("bogus", "not a database URL"), ("postgresql+psycopg2://u@h/db", "driver psycopg2"),
                     ("sqlite://", "an in-memory SQLite database"), ("sqlite:///:memory:", "an in-memory SQLite"),
                     ("postgresql+psycopg://u@h", "names no database")):
        with pytest.raises(ValueError, match=f"^database_url: .*{re.escape(why)}.*{re.escape(valid)}") as caught:
            load_config(env={}, overrides={"database_url": bad})
        assert repr(mask_secrets(bad)) in str(caught.value), caught.value  # as given, less any user or password
    with pytest.raises(ValueError, match="^database_url: .*\\*\\*\\*@h/db") as caught:  # a password is not printed
        load_config(env={}, overrides={"database_url": "mysql://u:hunter2@h/db"})
    assert "hunter2" not in str(caught.value)
    for given, used in (("postgres://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
                        ("postgresql://u:pw@h/db?sslmode=require", "postgresql+psycopg://u:pw@h/db?sslmode=require"),
                        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
                        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"), ("sqlite+pysqlite:///x.db", "sqlite+pysqlite:///x.db")):
        assert load_config(env={}, overrides={"database_url": given}).effective_database_url == used


def test_every_address_setting_reads_host_port_one_way() -> None:
    """Regression: the bind address, the advertised address and the metrics address each split
    HOST:PORT by hand, with different rules. `127.0.0.1:²` failed with "invalid literal for int()",
    naming no setting; `h:٣` (an Arabic-Indic 3) passed as port 3, which gRPC cannot parse; an
    unclosed `[::1:50051` was bound, and `::1:8080` advertised to clients that read it otherwise."""
    from cgsvc.server.addresses import parse_host_port
    from cgsvc.server.main import start_metrics
    assert parse_host_port("[::1]:50051") == ("[::1]", 50051) and parse_host_port(":0") == ("", 0)
    assert parse_host_port("cgsvc-0.cgsvc.svc:65535") == ("cgsvc-0.cgsvc.svc", 65535)
    for bad in ("127.0.0.1:²", "h:٣", "[::1:50051", "::1]:50051", "::1:8080", "[no-v6]:1", "h st:1", "h:+1", "h:-1"):
        assert parse_host_port(bad) is None, bad
        with pytest.raises(ValueError, match=r"^address must be HOST:PORT \(port 0-65535"):
            load_config(env={}, overrides={"address": bad})
        with pytest.raises(ValueError, match="HOST:PORT that clients can dial"):
            check_advertised(bad)
        with pytest.raises(ValueError, match=r"^must be HOST:PORT \(port 0-65535"):
            start_metrics(bad)


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1:0") and is_loopback("[::1]:50051") and is_loopback("localhost:1")
    assert not is_loopback("0.0.0.0:50051") and not is_loopback("[::]:1") and not is_loopback("10.0.0.1:1")
    assert not is_loopback(":50051")


def test_the_advertised_address_is_one_a_client_can_dial() -> None:
    assert advertised("0.0.0.0:0", 50051, "node-7") == "node-7:50051"  # a wildcard: the machine's name
    assert advertised("[::]:50051", 50051, "node-7") == "node-7:50051"
    assert advertised(":50051", 50051, "node-7") == "node-7:50051"
    assert advertised("10.0.0.5:0", 40123, "node-7") == "10.0.0.5:40123"  # port 0: the port it got
    assert advertised("[::1]:7", 7, "node-7") == "[::1]:7"
    assert check_advertised("cgsvc-0.cgsvc.svc:50051") == "cgsvc-0.cgsvc.svc:50051"
    for bad in ("cgsvc-0", "0.0.0.0:50051", "[::]:1", ":50051", "h:0", "h:65536", "h:port"):
        with pytest.raises(ValueError, match="HOST:PORT that clients can dial"):
            check_advertised(bad)


def test_a_name_is_loopback_by_what_it_resolves_to() -> None:
    # what this machine's resolver says of localhost, and what a hosts file could make it say
    assert is_loopback("localhost:1", resolve=lambda host: ["127.0.0.1", "::1"])
    assert not is_loopback("localhost:1", resolve=lambda host: ["127.0.0.1", "192.0.2.7"])
    assert not is_loopback("no-such-host.invalid:1")  # the real resolver: unresolvable is not loopback
    assert not is_loopback("localhost:1", resolve=lambda host: [])


def test_authenticator(tmp_path: Path) -> None:
    tf = tmp_path / "t.toml"
    tf.write_text(f'[[tokens]]\nprincipal = "bot"\nroles = ["auditor"]\nsha256 = "{hash_token("s3cret")}"\n')
    auth = Authenticator(str(tf))
    p = auth.authenticate({"authorization": "Bearer s3cret"}, None)
    assert p.name == "bot" and p.may_call("/cgsvc.v1.AuditService/VerifyAuditLog")
    assert not p.may_call("/cgsvc.v1.PlanService/ResolvePlan")
    for md in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic s3cret"}):
        with pytest.raises(AuthError) as e:
            auth.authenticate(md, None)
        assert e.value.code == "UNAUTHENTICATED"
    tf.write_text('[[tokens]]\nprincipal = "bot"\nroles = ["god"]\nsha256 = "x"\n')
    with pytest.raises(ValueError, match="roles"):
        Authenticator(str(tf))
    assert Authenticator("").authenticate({}, None).roles == ("admin",)


GOOD = hash_token("s3cret")


@pytest.mark.parametrize(("body", "names"), [
    ('[[tokens]]\nprincipal = "bot"\nroles = ["admin"]\n', "tokens[0].sha256: missing"),
    ('[[tokens]]\nprincipal = "bot"\nroles = ["admin"]\nsha256 = "s3cret"\n', "tokens[0].sha256: the token's SHA-256"),
    (f'[[tokens]]\nprincipal = "bot"\nrole = ["admin"]\nsha256 = "{GOOD}"\n', "tokens[0].role: unknown key"),
    (f'[[tokens]]\nprincipal = ""\nroles = ["admin"]\nsha256 = "{GOOD}"\n', "tokens[0].principal: a non-empty"),
    (f'[[token]]\nprincipal = "bot"\nroles = ["admin"]\nsha256 = "{GOOD}"\n', "token: unknown key"),
    ('tokens = "x"\n', "tokens: must be an array of tables"),
    (f'[[tokens]]\nprincipal = "a"\nroles = []\nsha256 = "{GOOD}"\n'
     f'[[tokens]]\nprincipal = "b"\nroles = []\nsha256 = "{GOOD.upper()}"\n', "tokens[1].sha256: the same token as 'a'"),
    ('[[certificates]]\ncommon_name = "o"\nroles = []\n[[certificates]]\ncommon_name = "o"\nroles = []\n',
     "certificates[1].common_name: 'o' is given twice"),
    ('[[certificates]]\nroles = ["launcher"]\n', "certificates[0].common_name: missing"),
    ("[[tokens]\n", "not TOML"),
    (f'[[tokens]]\nprincipal = "a"\nroles = []\nsha256 = "{GOOD}"\nexpires = 2027-01-31T00:00:00\n',
     "tokens[0].expires: a TOML date-time with an offset"),  # a local time: whose clock?
    (f'[[tokens]]\nprincipal = "a"\nroles = []\nsha256 = "{GOOD}"\nexpires = "2027-01-31T00:00:00Z"\n',
     "tokens[0].expires: a TOML date-time with an offset, e.g. 2027-01-31T00:00:00Z (unquoted)"),
    ('[[certificates]]\ncommon_name = "o"\nroles = []\nexpires = 2027-01-31T00:00:00Z\n',
     "certificates[0].expires: unknown key"),
])
def test_a_bad_token_file_is_refused_naming_the_entry(tmp_path: Path, body: str, names: str) -> None:
    tf = tmp_path / "t.toml"
    tf.write_text(body)
    with pytest.raises(TokenFileError) as err:
        Authenticator(str(tf))
    assert str(err.value).startswith(f"token_file {tf}: ") and names in str(err.value), str(err.value)


def test_a_misspelt_setting_in_the_environment_is_warned_of() -> None:
    """CGSVC_TOKEN_FIL=... ran a server with no token file and said nothing."""
    from cgsvc.server.config import misspelt_environment

    env = {"CGSVC_TOKEN_FIL": "/etc/t.toml", "CGSVC_ADRESS": "x", "CGSVC_ADDRESS": "127.0.0.1:1",
           "CGSVC_SERVER": "h:1", "CGSVC_TOKEN": "t", "CGSVC_TEST_PG": "url", "HOME": "/root"}
    assert misspelt_environment(env) == [
        "$CGSVC_ADRESS is not a setting and is ignored; did you mean CGSVC_ADDRESS?",
        "$CGSVC_TOKEN_FIL is not a setting and is ignored; did you mean CGSVC_TOKEN_FILE?"]
    assert misspelt_environment({"CGSVC_SERVER": "h:1", "CGSVC_BENCH_PG": "url"}) == []


def test_filter_parser() -> None:
    fields = {"model": "str", "sequence": "int"}
    assert parse_filter('model = "a b" AND sequence >= 3', fields) == [Term("model", "=", "a b"), Term("sequence", ">=", 3)]
    for bad in ("model", "model = ", 'model = "x" AND', "sequence = x", "colour = 1", 'model = "x" OR', "model ~ 1"):
        with pytest.raises(FilterError):
            parse_filter(bad, fields)


def test_or_joins_terms_and_binds_tighter_than_and_as_aip_160_says() -> None:
    """`a OR b AND c` is `(a OR b) AND c` (AIP-160: OR binds tighter than AND); parentheses
    group terms joined by OR, and a group may nest; a filter is kept as a conjunction of
    alternatives, so an AND group as one side of OR is refused, saying how to write it."""
    from cgsvc.audit.filters import AnyOf

    fields = {"model": "str", "state": "str", "labels": "labels", "sequence": "int"}
    a, b, m = Term("state", "=", "a"), Term("state", "=", "b"), Term("model", "=", "m")
    either = AnyOf((a, b))
    for text in ('state = a OR state = b AND model = m', '(state = a OR state = b) AND model = m',
                 '((state = a) OR (state = b)) AND (model = m)', '(state = a OR (state = b)) AND model = m'):
        assert parse_filter(text, fields) == [either, m], text
    assert parse_filter('model = m AND state = a OR state = b', fields) == [m, either]
    assert parse_filter('(model = m AND state = a)', fields) == [m, a]  # an AND group inside AND: the same terms
    assert parse_filter('state = a OR (state = b OR model = m)', fields) == [AnyOf((a, b, m))]
    assert parse_filter('NOT labels.team:* OR labels.team = "infra"', fields) == [
        AnyOf((Term("labels.team", "NOT :*", ""), Term("labels.team", "=", "infra")))]
    for bad, said in (('(state = a AND model = m) OR state = b', r"\(a OR c\) AND \(b OR c\)"),
                      ('state = b OR (state = a AND model = m)', "cannot be one side of OR"),
                      ('(state = a OR state = b', r"expected \) to close"),
                      ('state = a)', r"a \) with no \( before it"), ('()', "expected FIELD OP VALUE"),
                      ('OR state = a', "unknown field 'OR'"), ('state = a OR', "expected FIELD OP VALUE"),
                      ('state = a or state = b', "AND, OR and NOT are upper case; got 'or'"),
                      ('state = a and state = b', "AND, OR and NOT are upper case; got 'and'"),
                      ('state = a state = b', "expected AND or OR between terms, got 'state'"),
                      ("(" * 9 + "state = a" + ")" * 9, "at most 8 deep")):
        with pytest.raises(FilterError, match=said):
            parse_filter(bad, fields)


def test_filter_values_of_closed_sets_match_as_spec_values_do() -> None:
    """A filter is input: a closed set's value is matched case-insensitively and compared in its
    one spelling, as a spec's is; a value outside a closed set is refused naming the set (an
    empty page would read as "none"); a catalogued name (a GPU, a model by id or alias) is compared
    in the catalog's spelling and as typed, and an unknown one as typed."""
    from cgsvc.audit.filters import Catalogued, Closed

    fields = {"backend": Closed(("disabled", "tc_piecewise")), "state": Closed(("RUNNING", "LOST")),
              "gpu": Catalogued(lambda v: "H200" if v.lower() == "h200" else None)}
    assert parse_filter('backend = "TC_Piecewise" AND state != running', fields) == [
        Term("backend", "=", "tc_piecewise"), Term("state", "!=", "RUNNING")]
    assert parse_filter('gpu = "h200"', fields) == [Term("gpu", "=", "H200", ("h200",))]
    assert parse_filter('gpu = "H200"', fields) == [Term("gpu", "=", "H200")]
    assert parse_filter('gpu = "X9"', fields) == [Term("gpu", "=", "X9")]
    with pytest.raises(FilterError, match=r"backend: unknown value 'piecewise'; did you mean 'tc_piecewise'\? "
                                          r"valid: disabled, tc_piecewise$"):
        parse_filter('backend = "piecewise"', fields)
    with pytest.raises(FilterError, match=r"backend: unknown value 'warp'; valid: disabled, tc_piecewise$"):
        parse_filter('backend = "warp"', fields)
    with pytest.raises(FilterError, match=r"state: unknown value 'RUNING'; did you mean 'RUNNING'\? valid: "):
        parse_filter('state = "RUNING"', fields)


def test_a_resource_name_in_a_filter_is_read_as_its_id_and_another_collection_is_refused() -> None:
    """`plan = "plans/ID"` and `plan = "ID"` are one filter; `experiment = "launches/ID"` (a
    launch's name where an experiment's is asked) used to match nothing, an empty page read as
    "none": it is refused, naming the collection the field takes."""
    from cgsvc.audit.filters import Named

    fields = {"plan": Named("plans"), "experiment": Named("experiments")}
    assert parse_filter('plan = "plans/p1" AND experiment = e1', fields) == [
        Term("plan", "=", "p1"), Term("experiment", "=", "e1")]
    assert parse_filter('experiment = ""', fields) == [Term("experiment", "=", "")]  # none: asked on its own
    for bad in ('experiment = "launches/l1"', 'plan = "plans/"', 'plan = "plans/a/b"', 'plan = "/p1"'):
        with pytest.raises(FilterError, match=r"(plan|experiment) takes (plans|experiments)/ID or the bare ID, got "):
            parse_filter(bad, fields)


def test_a_label_is_asked_for_by_key_alone_with_has() -> None:
    """AIP-160's has operator, `labels.team:*`: a label with that key, whatever its value; on
    labels only (a time's colons still read as part of its word)."""
    fields = {"labels": "labels", "state": "str", "time": "time"}
    assert parse_filter('labels.team:* AND state = "x"', fields) == [Term("labels.team", ":*", ""),
                                                                     Term("state", "=", "x")]
    assert parse_filter("labels.team :*", fields) == [Term("labels.team", ":*", "")]
    assert parse_filter("time >= 2026-12-06T08:00:00Z", fields)[0].value == "2026-12-06T08:00:00.000000Z"
    assert parse_filter('NOT labels.team:* AND state = "x"', fields)[0] == Term("labels.team", "NOT :*", "")
    for bad, said in (("state:*", "applies to labels.KEY only"), ("labels.Team:*", "a label key is"),
                      ("labels:*", "applies to labels.KEY only"), ("labels.team:* state", "expected AND"),
                      ("NOT", "expected FIELD OP VALUE")):
        with pytest.raises(FilterError, match=said):
            parse_filter(bad, fields)


def test_not_asks_for_the_opposite_of_a_term_or_a_group() -> None:
    """AIP-160's NOT: of a term, the opposite comparison (so that it means what != and the
    opposite comparisons mean: a launch with no report, or no measure, matches neither a term nor
    its NOT); of a group, each term's opposite by De Morgan, so that the filter stays a
    conjunction of alternatives; of a group of both AND and OR, refused."""
    from cgsvc.audit.filters import AnyOf

    fields = {"model": "str", "state": "str", "labels": "labels", "sequence": "int"}
    assert parse_filter('NOT state = "a"', fields) == [Term("state", "!=", "a")]
    assert parse_filter("NOT sequence > 3 AND NOT sequence <= 1", fields) == [Term("sequence", "<=", 3),
                                                                            Term("sequence", ">", 1)]
    assert parse_filter("NOT sequence < 3 AND NOT sequence >= 9", fields) == [Term("sequence", ">=", 3),
                                                                            Term("sequence", "<", 9)]
    assert parse_filter('NOT (state = "a" OR state = "b")', fields) == [Term("state", "!=", "a"),
                                                                       Term("state", "!=", "b")]
    assert parse_filter('NOT (state = "a" AND model != "m")', fields) == [
        AnyOf((Term("state", "!=", "a"), Term("model", "=", "m")))]
    assert parse_filter("NOT NOT labels.team:*", fields) == [Term("labels.team", ":*", "")]
    assert parse_filter('NOT (labels.team:* OR state = "a") AND model = "m"', fields) == [
        Term("labels.team", "NOT :*", ""), Term("state", "!=", "a"), Term("model", "=", "m")]
    assert parse_filter('state = "a" OR NOT (model = "m")', fields) == [
        AnyOf((Term("state", "=", "a"), Term("model", "!=", "m")))]
    for bad, said in (('NOT ((state = "a" OR state = "b") AND model = "m")', "NOT of a group joined by both"),
                      ("NOT " * 9 + "labels.team:*", "at most 8 deep"), ("NOT", "expected FIELD OP VALUE")):
        with pytest.raises(FilterError, match=said):
            parse_filter(bad, fields)


def test_a_trailing_star_asks_for_a_prefix_of_a_text_field() -> None:
    """AIP-160's wildcard, at a value's end: `principal = "ci-*"`, `model = "deepseek-ai/*"` (not
    looked up in the catalog: a family, not a model), `labels.team = "infra-*"`, `rule_id =
    "breakable.*"`; anywhere else, or on a field of a closed set, a number, a time or a resource
    name, refused by name."""
    from cgsvc.audit.filters import Catalogued, Closed, Named

    fields = {"principal": "str", "labels": "labels", "state": Closed(("RUNNING",)), "sequence": "int",
              "model": Catalogued(lambda v: "deepseek-ai/DeepSeek-V3" if v.lower() == "deepseek-v3" else None),
              "plan": Named("plans"), "time": "time"}
    assert parse_filter('principal = "ci-*"', fields) == [Term("principal", "=", "ci-", prefix=True)]
    assert parse_filter('model = "deepseek-ai/*" AND NOT labels.team = "infra-*"', fields) == [
        Term("model", "=", "deepseek-ai/", prefix=True, fold=True), Term("labels.team", "!=", "infra-", prefix=True)]
    assert parse_filter('principal = "*"', fields) == [Term("principal", "=", "", prefix=True)]
    for bad, said in (('principal = "c*i"', r"a \* may only end a value \(a prefix: \"ci-\*\"\)"),
                      ('principal = "**"', "may only end a value"),
                      ('principal > "ci-*"', r"a prefix \(\*\) takes = or !="),
                      ('state = "RUN*"', r"state: a prefix \(\*\) applies to text fields only"),
                      ('plan = "plans/*"', "plan: a prefix"), ('time = "2026-*"', "time: a prefix"),
                      ('sequence = "1*"', "sequence: a prefix"), ('labels.team = "In*"', "a label value is")):
        with pytest.raises(FilterError, match=said):
            parse_filter(bad, fields)


def test_filter_parser_bounds_what_reaches_sql() -> None:
    """Regressions: an integer past int64 (`sequence > 99999999999999999999999`) was an INTERNAL
    OverflowError in the driver; 40,000 terms were an INTERNAL error from SQLite's expression depth
    after seconds of work."""
    from cgsvc.audit.filters import MAX_TERMS

    fields = {"model": "str", "sequence": "int"}
    assert parse_filter(f"sequence >= {(1 << 63) - 1} AND sequence > -{1 << 63}", fields)[0].value == (1 << 63) - 1
    for big in (str(1 << 63), "9" * 23, "9" * 5000):
        with pytest.raises(FilterError, match=r"integer from -2\^63 to 2\^63-1"):
            parse_filter(f"sequence > {big}", fields)
    assert len(parse_filter(" AND ".join(['model = "a"'] * MAX_TERMS), fields)) == MAX_TERMS
    for joiner in (" AND ", " OR "):  # every term counts, however joined
        with pytest.raises(FilterError, match=f"at most {MAX_TERMS} terms"):
            parse_filter(joiner.join(['model = "a"'] * (MAX_TERMS + 1)), fields)


def test_a_client_target_is_local_by_its_addresses() -> None:
    local = lambda host: ["127.0.0.1"]  # noqa: E731
    remote = lambda host: ["192.0.2.7"]  # noqa: E731
    assert target_is_local("127.0.0.1:50051") and target_is_local("[::1]:1") and target_is_local("unix:/tmp/s")
    assert target_is_local("dns:///svc:1", resolve=local) and not target_is_local("dns:///svc:1", resolve=remote)
    assert target_is_local("dns:svc:1", resolve=local) and not target_is_local("dns://8.8.8.8/svc:1", resolve=remote)
    assert target_is_local("ipv4:127.0.0.1:1,127.0.0.2:2") and not target_is_local("ipv4:127.0.0.1:1,10.0.0.1:2")
    assert not target_is_local("10.0.0.1:50051") and not target_is_local("svc:1", resolve=remote)


def test_a_credentials_reload_names_who_gained_lost_or_changed_access() -> None:
    from cgsvc.server.auth import Principal
    from cgsvc.server.credentials import Admitted, changes

    old = Admitted({"a" * 64: Principal("alice", ("resolver",)), "b" * 64: Principal("ops", ("admin",))},
                   {"orchestrator": Principal("orchestrator", ("launcher",))})
    new = Admitted({"c" * 64: Principal("ops", ("admin",)), "d" * 64: Principal("ops", ("admin",))},
                   {"orchestrator": Principal("orchestrator", ("launcher", "auditor")),
                    "batch": Principal("batch", ())})
    assert changes(old, new) == [
        "added certificate 'batch' (no roles)", "removed token principal 'alice' (had resolver)",
        "certificate 'orchestrator': roles launcher -> auditor, launcher", "token principal 'ops': tokens replaced"]
    assert changes(new, new) == []


def test_a_token_past_its_expiry_is_refused_naming_when(tmp_path: Path) -> None:
    import time

    from cgsvc.server.main import token_warnings

    tf = tmp_path / "t.toml"
    tf.write_text(f'[[tokens]]\nprincipal = "old"\nroles = ["resolver"]\nsha256 = "{hash_token("t-old")}"\n'
                  f'expires = 2026-01-01T00:00:00Z\n'
                  f'[[tokens]]\nprincipal = "soon"\nroles = ["resolver"]\nsha256 = "{hash_token("t-soon")}"\n'
                  f'expires = 2999-01-01T00:00:00+02:00\n')
    auth = Authenticator(str(tf))
    with pytest.raises(AuthError) as e:
        auth.authenticate({"authorization": "Bearer t-old"}, None)
    assert (e.value.code, e.value.message) == (
        "UNAUTHENTICATED", "the bearer token of principal 'old' expired at 2026-01-01T00:00:00+00:00")
    soon = auth.authenticate({"authorization": "Bearer t-soon"}, None)
    assert soon.name == "soon" and soon.expiry() == "2998-12-31T22:00:00+00:00"
    now = soon.expires - 2.5 * 86400  # two and a half days before the second expires
    assert token_warnings(auth.tokens, {}, now) == [
        "a token of principal 'old' expired at 2026-01-01T00:00:00+00:00: it is refused",
        "a token of principal 'soon' expires at 2998-12-31T22:00:00+00:00, in 2.5 days"]
    assert token_warnings(auth.tokens, {}, time.time()) == [
        "a token of principal 'old' expired at 2026-01-01T00:00:00+00:00: it is refused"]


def _certificate(*names: str, common_name: str = "cgsvc") -> bytes:
    """A self-signed certificate for `names` (addresses as IP entries); none: no subjectAltName."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def entry(name: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + dt.timedelta(days=1)))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([entry(n) for n in names]), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_a_certificate_covers_the_names_a_client_would_accept() -> None:
    from cgsvc import tls

    cert = _certificate("cgsvc-0.cgsvc.svc", "*.replicas.example", "10.0.0.5", "::1")
    assert tls.names(cert) == ["cgsvc-0.cgsvc.svc", "*.replicas.example", "10.0.0.5", "::1"]
    for host in ("cgsvc-0.cgsvc.svc", "CGSVC-0.cgsvc.svc.", "r1.replicas.example", "10.0.0.5", "[::1]"):
        assert tls.covers(cert, host), host
    for host in ("cgsvc-1.cgsvc.svc", "a.b.replicas.example", "replicas.example", "10.0.0.6", "localhost"):
        assert not tls.covers(cert, host), host
    legacy = _certificate(common_name="node-7")  # no subjectAltName: the common name, as older clients read it
    assert tls.names(legacy) == ["node-7"] and tls.covers(legacy, "node-7") and not tls.covers(legacy, "node-8")


def test_a_device_list_longer_than_a_machine_holds_is_refused_before_it_is_made() -> None:
    """Regression: `--local-devices 0-99999999999` made the list (and compared every name with
    every other) before anything checked it: the start hung."""
    from cgsvc.launch.devices import MAX_LOCAL_DEVICES, DeviceListError, parse_devices

    assert MAX_LOCAL_DEVICES == 1024 and len(parse_devices("0-1023")) == 1024
    for text in ("0-99999999999", "0-1023,cpu0", "0-600,601-1200"):
        with pytest.raises(DeviceListError, match="at most 1024 devices"):
            parse_devices(text)
    with pytest.raises(DeviceListError, match="names 3 more than once"):
        parse_devices("0-3,3")
