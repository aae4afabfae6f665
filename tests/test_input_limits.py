"""The limits of input, the same on every backend: keys and ids of at most MAX_KEY_BYTES UTF-8 bytes, str
subclasses taken for the text they hold, no write that takes the byte total past 64 bits, ttl arithmetic
that cannot overflow, and PostgreSQL URLs that name neither a system schema nor a parameter sift would drop.
Bad input is InvalidBatchInput naming the field, and the tables are exactly as they were."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import make_job, make_target, make_targets, snapshot, stored_job

from sift import dcache
from sift.dcache import MAX_KEY_BYTES
from sift.dcache.backends import parse_target

#: Ordinary text PostgreSQL cannot compress below its index entry limit.
INCOMPRESSIBLE = "".join(random.Random(1).choices(string.ascii_letters + string.digits, k=4000))


def refused(call: Callable[[], Any], field: str) -> str:
    """``call`` raises InvalidBatchInput naming ``field``, and changes no row."""
    before = snapshot(), dcache.batch_nbytes()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        call()
    assert info.value.field == field
    assert (snapshot(), dcache.batch_nbytes()) == before
    return info.value.problem


# -- Keys and ids --------------------------------------------------------------------------------------

LONG = INCOMPRESSIBLE[: MAX_KEY_BYTES + 1]


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("id", lambda: dcache.create_batch_job(make_job(LONG, targets_total=1), make_targets(1))),
        ("caller", lambda: dcache.create_batch_job(make_job("j", caller=LONG))),
        ("idem_key", lambda: dcache.submit_batch_job(make_job("j", idem_key=LONG), make_targets(3), 60)),
        ("id", lambda: dcache.submit_batch_job(make_job("é" * (MAX_KEY_BYTES // 2 + 1)), None, 60)),
    ],
    ids=["id", "caller", "idem_key", "id-two-byte-chars"],
)
def test_a_key_over_the_limit_is_refused_naming_it(
    store: dcache.StoreDatabase, field: str, call: Callable[[], Any]
) -> None:
    dcache.create_batch_job(make_job("held", targets_total=1), make_targets(1))
    assert f"at most {MAX_KEY_BYTES} bytes" in refused(call, field)


def test_keys_at_the_limit_are_stored_on_every_backend(store: dcache.StoreDatabase) -> None:
    """The longest id, caller and idem_key at once, of text no backend can compress."""
    key = INCOMPRESSIBLE[:MAX_KEY_BYTES]
    job_id, caller, idem_key = key, key[::-1], key[1:] + key[0]
    found = dcache.submit_batch_job(make_job(job_id, caller=caller, idem_key=idem_key), make_targets(3), 60)
    assert found == (job_id, True)
    assert dcache.batch_job_by_idem(caller, idem_key, 60, now=1_000) == job_id
    assert dcache.check_store().ok


# -- str subclasses ------------------------------------------------------------------------------------


class JSONText(str):
    """A str subclass as a project might mark JSON with."""


class Shown(str):
    """A str subclass whose str() is not what it holds."""

    def __str__(self) -> str:
        return "ok\x00<hidden>"


class Hiding(str):
    """A str subclass that says it holds no NUL and is ASCII."""

    def __contains__(self, item: object) -> bool:
        return False

    def isascii(self) -> bool:
        return True


def test_a_str_subclass_with_a_nul_in_options_is_refused(store: dcache.StoreDatabase) -> None:
    dcache.create_batch_job(make_job("j", targets_total=2))
    call = lambda: dcache.put_batch_targets("j", [make_target(0, options=JSONText("{}\x00junk"))])  # noqa: E731
    refused(call, "options")


@pytest.mark.parametrize("field", ["id", "caller", "idem_key", "error"])
def test_a_str_subclass_hiding_a_nul_is_refused(store: dcache.StoreDatabase, field: str) -> None:
    refused(lambda: dcache.create_batch_job(make_job("j", **{field: Hiding("a\x00b")})), field)


def test_a_str_subclass_hiding_a_nul_in_a_url_is_refused(store: dcache.StoreDatabase) -> None:
    target = make_target(0, url=Hiding("a\x00"))
    refused(lambda: dcache.create_batch_job(make_job("j", targets_total=1), [target]), "url")


def test_a_str_subclass_is_stored_as_the_text_it_holds(store: dcache.StoreDatabase) -> None:
    dcache.create_batch_job(
        make_job(Shown("j"), caller=Shown("alice"), targets_total=1),
        [make_target(0, url=JSONText("https://x/"), options=JSONText('{"a":1}'))],
    )
    dcache.set_batch_job_status("j", "failed", Shown("fine"), now=1_001)
    job = dcache.batch_job("j")
    assert job is not None and (job.id, job.caller, job.error) == ("j", "alice", "fine")
    targets = dcache.batch_targets("j")
    assert targets is not None and (targets[0].url, targets[0].options) == ("https://x/", '{"a":1}')
    assert dcache.check_store().ok


# -- 64-bit sums and ttl arithmetic --------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [2**62, 2**62 - 1, 1])
def test_a_job_that_would_take_the_byte_total_past_64_bits_is_refused(
    store: dcache.StoreDatabase, nbytes: int
) -> None:
    """A created job brings no bytes of its own (its nbytes follows its results), so none takes the total
    past 2**63 - 1: near the limit, as anywhere, the nbytes it carries is refused."""
    stored_job(make_job("a", targets_total=0, status="done"), nbytes=2**62)  # a total near the limit
    job = make_job("b", targets_total=0, status="done", nbytes=nbytes)
    problem = refused(lambda: dcache.create_batch_job(job), "nbytes")
    assert "must be 0" in problem
    assert dcache.batch_nbytes() == 2**62


NOW = 2**63 - 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: dcache.sweep_batch(0.5, now=NOW),
        lambda: dcache.sweep_candidates(0.5, now=NOW),
        lambda: dcache.batch_job_by_idem("alice", "k", 0.5, now=NOW),
        lambda: dcache.rescue_stale_jobs(0.5, "stale", now=NOW),
    ],
    ids=["sweep_batch", "sweep_candidates", "batch_job_by_idem", "rescue_stale_jobs"],
)
def test_a_float_ttl_with_now_near_the_64_bit_limit_is_exact(
    store: dcache.StoreDatabase, call: Callable[[], Any]
) -> None:
    """floor(NOW - 0.5) is NOW - 1: the job whose lease is NOW - 1 is due, the one at NOW is not."""
    dcache.create_batch_job(make_job("due", targets_total=0, status="done", idem_key="k", lease=NOW - 1))
    dcache.create_batch_job(make_job("kept", targets_total=0, status="done", lease=NOW))
    result = call()
    if isinstance(result, int):
        assert result in (0, 1)
    assert dcache.batch_job("kept") is not None


def test_a_submit_with_a_float_ttl_at_the_64_bit_limit_finds_its_key(store: dcache.StoreDatabase) -> None:
    dcache.create_batch_job(make_job("due", status="done", idem_key="k", lease=NOW - 1), make_targets(3))
    assert dcache.submit_batch_job(make_job("new", idem_key="k"), None, 0.5, now=NOW) == ("new", True)
    assert dcache.submit_batch_job(make_job("newer", idem_key="k"), None, 1.5, now=NOW) == ("due", False)


def test_cutoff_is_exact_for_floats() -> None:
    from sift.dcache import validation

    assert validation.cutoff(NOW, 0.5) == NOW - 1
    assert validation.cutoff(NOW, 0.0) == NOW
    assert validation.cutoff(10, 2.25) == 7
    assert validation.cutoff(10, 1e300) == -1


# -- PostgreSQL URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "pg_toast", "pg_mine"])
def test_a_system_schema_is_refused(schema: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="PostgreSQL's own schema"):
        parse_target(f"{POSTGRES_URL}?schema={schema}")


@pytest.mark.postgres
def test_opening_a_system_schema_creates_nothing_there(postgres_schema: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="PostgreSQL's own schema"):
        dcache.open_db(f"{POSTGRES_URL}?schema=information_schema")
    with psycopg.connect(POSTGRES_URL) as conn:
        found = conn.execute("SELECT to_regclass('information_schema.batch_job')").fetchone()
    assert found == (None,)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("options=-c%20search_path%3Dpublic", "'options'"),
        ("connect_timeout=1", "'connect_timeout'"),
        ("replication=true", "'replication'"),
        ("Schema=x", "'Schema'"),
        ("schema=s&colour=blue", "'colour'"),
    ],
)
def test_an_unknown_url_parameter_is_refused_naming_it(query: str, named: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="url: unknown or sift-set parameter") as info:
        parse_target(f"{POSTGRES_URL}?{query}")
    assert named in str(info.value)


@pytest.mark.parametrize("query", ["schema=mine&schema=public", "schema=public&schema=public"])
def test_a_schema_named_twice_is_refused(query: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="named 2 times"):
        parse_target(f"{POSTGRES_URL}?{query}")


@pytest.mark.parametrize(
    ("query", "schema"),
    [("", "public"), ("?schema=public", "public"), ("?schema=mine&sslmode=disable", "mine")],
)
def test_public_only_when_named_or_when_no_schema_is_given(query: str, schema: str) -> None:
    url, found = parse_target(f"{POSTGRES_URL}{query}")
    assert found == schema and "schema=" not in url
