"""What counts as one host: url_host, one name per site whatever its spelling, as the per-host claim limit
counts it; and schema version 6's upgrade, which computes every stored target's host again."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import idna
import pytest
from helpers import SITE_SPELLINGS, make_job
from hypothesis import given
from hypothesis import strategies as st

from sift import dcache
from sift.dcache import db, hosts
from sift.dcache.hosts import BACKFILL_CHUNK, site_name
from sift.dcache.tables import HOSTS_VERSION, SCHEMA_VERSION


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://example.com/a", "example.com"),
        ("https://Example.COM/a", "example.com"),  # lower-cased
        ("https://user:secret@example.com:8443/a", "example.com"),  # no userinfo, no port
        ("https://user:p@ss@example.com/a", "example.com"),  # the last @ ends the userinfo
        ("http://example.com./a", "example.com"),  # the root's trailing dot names the same host
        ("http://example.com..:80/a", "example.com"),
        ("HTTP://a.example.com", "a.example.com"),  # a subdomain is a host of its own
        ("https://a.github.io/", "a.github.io"),  # not its registrable domain: github.io has many owners
        ("http://[2001:DB8::1]:8080/", "2001:db8::1"),  # IPv6 without its brackets
        ("http://[2001:db8:0:0:0:0:0:1]/", "2001:db8::1"),  # compressed
        ("http://[2001:0db8::0001]/", "2001:db8::1"),
        ("http://[::1]/", "::1"),
        ("http://[::ffff:127.0.0.1]/", "127.0.0.1"),  # an IPv4-mapped IPv6 address is its IPv4 address
        ("http://[::FFFF:7f00:1]:80/", "127.0.0.1"),
        ("http://[v1.fut]/", "v1.fut"),  # in brackets but no IPv6 address: as written, lower-cased
        ("http://127.0.0.1:80/", "127.0.0.1"),
        ("http://2130706433/", "127.0.0.1"),  # every IPv4 spelling WHATWG URLs accept: one integer
        ("http://0x7f000001/", "127.0.0.1"),  # hexadecimal
        ("http://0X7F.0.0.1/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),  # octal
        ("http://127.1/", "127.0.0.1"),  # shortened: the last number fills the rest
        ("http://127.0.1/", "127.0.0.1"),
        ("http://127.0.0.1./", "127.0.0.1"),
        ("http://4294967295/", "255.255.255.255"),
        ("http://0x/", "0.0.0.0"),
        # full-width digits: IDNA maps them, then the IPv4 rule reads them
        ("http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/", "127.0.0.1"),
        ("http://256.0.0.1/", "256.0.0.1"),  # WHATWG refuses these: kept as written
        ("http://4294967296/", "4294967296"),
        ("http://1.2.3.4.5/", "1.2.3.4.5"),
        ("http://09.0.0.1/", "09.0.0.1"),  # 9 is no octal digit
        ("http://1_2.0.0.1/", "1_2.0.0.1"),  # int() would take these, WHATWG does not
        ("http://+1.0.0.1/", "+1.0.0.1"),
        ("http://1..1/", "1..1"),
        ("https://exämple.com/", "xn--exmple-cua.com"),  # IDNA: lower-case A-labels
        ("https://EXÄMPLE.com/", "xn--exmple-cua.com"),
        ("https://xn--exmple-cua.com/", "xn--exmple-cua.com"),
        ("https://XN--EXMPLE-CUA.com/", "xn--exmple-cua.com"),
        # full-width letters: NFKC makes them ASCII
        ("https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/", "example.com"),
        ("https://example。com/", "example.com"),  # an ideographic full stop separates labels too
        ("http://münchen.DE/", "xn--mnchen-3ya.de"),
        ("https://faß.de/", "xn--fa-hia.de"),  # non-transitional: ß stays ß, not ss
        ("http://ex\u00adample.com/", "example.com"),  # UTS #46 drops a soft hyphen
        ("http://ex%61mple.com/", "example.com"),  # a percent-encoded host, decoded first
        ("http://%C3%A9.com/", "xn--9ca.com"),
        ("http://a_b.example/", "a_b.example"),  # names IDNA refuses: as written, lower-cased
        ("http://-A.example/", "-a.example"),
        ("http://xn--ZZ.example/", "xn--zz.example"),  # not punycode
        ("http://exä_mple.com/", "exä_mple.com"),
        ("http://ÄÖ--x.com/", "äö--x.com"),
        (f"http://{'Ä' * 300}.com/", f"{'ä' * 300}.com"),  # too long for DNS, and for the cache
        ("//example.com/a", "example.com"),  # an authority without a scheme
        ("example.com/a", ""),  # no authority: the "no host" host
        ("mailto:someone@example.com", ""),
        ("http://[::1/", ""),  # Python cannot split it
        ("file:///etc/hosts", ""),
        ("http://./", ""),
        ("", ""),
    ],
)
def test_the_host_of_a_url(url: str, host: str) -> None:
    assert dcache.url_host(url) == host


#: One URL per spelling: three sites (127.0.0.1, exämple.com, example.com) written eight ways.
SPELLINGS = [
    *SITE_SPELLINGS,
    "https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/",  # example.com in full-width letters
]
SITES = {"127.0.0.1", "xn--exmple-cua.com", "example.com"}


def test_eight_spellings_are_three_sites() -> None:
    assert {dcache.url_host(url) for url in SPELLINGS} == SITES


@given(st.text())
def test_any_url_has_a_host(url: str) -> None:
    """Every insert computes the host: no URL may make it raise."""
    for text in (url, f"http://{url}", f"http://[{url}]/"):
        host = dcache.url_host(text)
        assert host == host.lower() and not host.endswith(".")


def split_host(url: str) -> str:
    """url_host as urlsplit reads the authority, with no shortcut."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return ""
    return hosts._authority_host(netloc)


#: Pieces of URLs where a shortcut past urlsplit could go wrong: schemes, delimiters, brackets, userinfo,
#: ports, what urlsplit strips or removes, non-ASCII.
URL_PIECES = ["", "h", "HTTPS", "a+b-c.d", "1a", ":", "//", "/", "?", "#", "@", "[", "]", "::1", "Ex.COM."]
URL_PIECES += ["u:p@", ":80", "%41", " ", "\t", "\n", "\x01", "é", "0x7f.1", ".", "\\", ";"]


@given(st.lists(st.sampled_from(URL_PIECES), max_size=8).map("".join) | st.text())
def test_url_host_reads_the_authority_as_urlsplit_does(url: str) -> None:
    """url_host takes a plain URL's authority without urlsplit: the same host for every URL."""
    assert dcache.url_host(url) == split_host(url)


@given(st.from_regex(r"[A-Za-z0-9_-]{1,12}(\.[A-Za-z0-9_-]{1,12}){0,3}\.?", fullmatch=True))
def test_an_ascii_name_is_what_the_idna_package_makes_of_it(name: str) -> None:
    """The fast path for ASCII names: lower-cased, it is IDNA's A-labels, or a name IDNA refuses."""
    try:
        encoded = idna.encode(name, uts46=True, transitional=False).decode().rstrip(".")
    except idna.IDNAError:
        encoded = name.lower().rstrip(".")
    last = encoded.rpartition(".")[2]
    if not (last.isdigit() or last.startswith("0x")):  # those are IPv4 addresses, or kept as written
        assert site_name(name) == encoded


def test_per_host_1_claims_one_target_per_site(store: Any) -> None:
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(SPELLINGS)]
    dcache.create_batch_job(make_job("j", targets_total=len(targets)), targets)
    got = dcache.claim_batch_targets(100, per_host=1, runner="r", now=5)
    assert sorted(dcache.url_host(t.url) for t in got) == sorted(SITES)
    assert dcache.claim_batch_targets(100, per_host=1, runner="r", now=6) == []  # each site at its limit


def old_host(url: str) -> str:
    """The host version 5 stored: the name as written, lower-cased, without a trailing dot."""
    return (urlsplit(url).hostname or "").rstrip(".")


def make_version_5(target: str) -> int:
    """Turn the open store at ``target`` into a version 5 store holding targets of the eight spellings
    (more than one chunk of the upgrade), each with version 5's host; return how many targets."""
    count = BACKFILL_CHUNK + 2 * len(SPELLINGS)
    urls = [f"{SPELLINGS[i % len(SPELLINGS)]}{i}" for i in range(count)]
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
    dcache.create_batch_job(make_job("old", targets_total=count), targets)
    for spelling in SPELLINGS:
        sql = f"UPDATE batch_target SET host = {db.backend.param} WHERE url LIKE {db.backend.param}"
        db.execute_sql(sql, (old_host(spelling), f"{spelling}%"))
    if target.endswith(".db"):
        db.execute_sql("PRAGMA user_version = 5")
    else:
        db.execute_sql("UPDATE sift_schema SET version = 5")
    dcache.close_db()
    return count


def stored_version(target: str) -> int:
    if target.endswith(".db"):
        with closing(sqlite3.connect(target)) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
    return int(db.execute_sql("SELECT version FROM sift_schema").fetchone()[0])


def test_the_upgrade_to_version_6_gives_every_stored_target_its_sites_host(shared_store: str) -> None:
    assert HOSTS_VERSION == 6 <= SCHEMA_VERSION  # the hosts' rule is version 6's; later versions keep it
    count = make_version_5(shared_store)
    dcache.open_db(shared_store, readonly=True)  # a version 5 store reads as it is
    assert stored_version(shared_store) == 5
    hosts = dict(db.execute_sql("SELECT url, host FROM batch_target").fetchall())
    assert len(set(hosts.values())) == len(SPELLINGS)  # as version 5 stored them: one per spelling
    assert len(dcache.batch_targets("old") or []) == count
    kinds = {v.kind for v in dcache.check_store().violations}
    assert "target_host" not in kinds  # an earlier rule's hosts are not this sift's to check
    dcache.open_db(shared_store)
    assert stored_version(shared_store) == SCHEMA_VERSION
    hosts = dict(db.execute_sql("SELECT url, host FROM batch_target").fetchall())
    assert len(hosts) == count and all(host == dcache.url_host(url) for url, host in hosts.items())
    assert set(hosts.values()) == SITES
    assert dcache.check_store().ok
    got = dcache.claim_batch_targets(100, per_host=1, runner="r", now=5)
    assert sorted(dcache.url_host(t.url) for t in got) == sorted(SITES)


def test_a_stale_host_is_reported(store: Any) -> None:
    """A pending target holding its version 5 host is a fault of the current schema's check."""
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(SPELLINGS)]
    dcache.create_batch_job(make_job("j", targets_total=len(targets)), targets)
    sql = f"UPDATE batch_target SET host = {db.backend.param} WHERE idx = 1"
    db.execute_sql(sql, (old_host(SPELLINGS[1]),))
    report = dcache.check_store()
    assert [(v.kind, v.job_id) for v in report.violations] == [("target_host", "j")]
    assert "'2130706433', not '127.0.0.1'" in report.violations[0].detail


@pytest.mark.postgres
def test_a_version_5_store_open_read_only_is_backed_up_with_its_sites_hosts(
    postgres_schema: str, tmp_path: Path
) -> None:
    """A backup is a current store file: the copy of a version 5 store computes its targets' hosts."""
    from conftest import open_empty_postgres, postgres_target

    open_empty_postgres(postgres_schema)
    target = postgres_target(postgres_schema)
    make_version_5(target)
    try:
        dcache.open_db(target, readonly=True)
        dest = tmp_path / "copy.db"
        dcache.backup_store(dest)
        with closing(sqlite3.connect(dest)) as conn:
            hosts = dict(conn.execute("SELECT url, host FROM batch_target").fetchall())
        assert all(host == dcache.url_host(url) for url, host in hosts.items())
        assert set(hosts.values()) == SITES
    finally:
        dcache.open_db(target)  # leave the worker's schema current
        dcache.close_db()
