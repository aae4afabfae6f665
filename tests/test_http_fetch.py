"""The built-in fetcher against a real HTTP server on 127.0.0.1: each status's outcome, the body as text or
base64, the size cap, the timeout, redirects within and over the limit, and the options it checks. The
server is on loopback, so these fetches pass ``allow_private=True``; test_http_refusals.py holds the rest."""

from __future__ import annotations

import base64
import email.utils
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fetch_server import BINARY, FetchServer, fetch_server

from sift import dcache
from sift.dcache import BatchTarget, clock
from sift.runner import Fail, GiveBack, Retry
from sift.runner.http import DEFAULT_MAX_BYTES, DEFAULT_MAX_REDIRECTS, RETRY_AFTER_MOST, fetch


@pytest.fixture(scope="module")
def server() -> Iterator[FetchServer]:
    with fetch_server() as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(server: FetchServer) -> None:
    server.requests.clear()


def get(url: str, options: Any = None, **kwargs: Any) -> str:
    text = "" if options is None else json.dumps(options)
    return fetch(
        BatchTarget(url=url, options=text), allow_private=kwargs.pop("allow_private", True), **kwargs
    )


def test_200_text_is_the_body_decoded(server: FetchServer) -> None:
    assert get(server.url("/text")) == "héllo wörld"
    assert get(server.url("/latin1")) == "café"
    assert server.paths() == ["/text", "/latin1"]


@pytest.mark.parametrize(
    "name",
    [
        "utf-8",
        "no-such-charset",
        "base64",
        "idna",
        pytest.param("undefined", marks=pytest.mark.slow),
        pytest.param("punycode", marks=pytest.mark.slow),
    ],
)
def test_a_charset_python_cannot_read_as_text_is_read_as_utf8(server: FetchServer, name: str) -> None:
    assert get(server.url(f"/charset?name={name}")) == "naïve"


@pytest.mark.parametrize("name", ["utf-7", "unicode_escape", "raw_unicode_escape"])
def test_a_lone_surrogate_a_charset_decodes_to_is_u_fffd_and_a_pair_its_character(
    server: FetchServer, name: str
) -> None:
    assert get(server.url(f"/surrogate?name={name}")) == "\ufffd and"
    assert get(server.url(f"/surrogate?name={name}&pair=1")) == "\U0001f600 and"


@pytest.mark.slow
def test_a_body_of_over_16_mi_characters_with_a_lone_surrogate_is_stored_as_text(server: FetchServer) -> None:
    """Its UTF-8 size is measured on the text as stored, U+FFFD in the surrogate's place."""
    pad = dcache.MAX_RESULT_BYTES // 4 + 1
    text = get(server.url(f"/surrogate?name=utf-7&pad={pad}"), {"max_bytes": pad + 64})
    assert text == "\ufffd and" + "a" * pad


def test_a_paced_target_past_its_send_by_is_given_back_without_a_request(server: FetchServer) -> None:
    late = BatchTarget(url=server.url("/text"), options="")
    late.send_by = clock.unix_time() - 0.001
    with pytest.raises(GiveBack):
        fetch(late, allow_private=True)
    assert server.paths() == []  # nothing reached the site
    in_time = BatchTarget(url=server.url("/text"), options="")
    in_time.send_by = clock.unix_time() + 60
    assert fetch(in_time, allow_private=True) == "héllo wörld"
    assert server.paths() == ["/text"]


def test_200_binary_is_text_with_replacements_or_base64(server: FetchServer) -> None:
    text = get(server.url("/binary"))
    assert text == BINARY.decode("utf-8", "replace").replace("\0", "\ufffd")
    assert "\0" not in text and "\ufffd" in text
    assert base64.b64decode(get(server.url("/binary"), {"body": "base64"}), validate=True) == BINARY


def test_the_results_are_stored_as_fetched(store: Any, server: FetchServer) -> None:
    urls = [
        (server.url("/text"), None),
        (server.url("/binary"), None),
        (server.url("/binary"), {"body": "base64"}),
    ]
    job_id, _ = dcache.submit("alice", urls, now=1_000)
    claimed = dcache.claim_batch_targets(10, runner="r", now=1_001)
    results = {t.idx: fetch(t, allow_private=True) for t in claimed}
    for idx, result in results.items():
        dcache.update_batch_target(job_id, idx, "done", result=result, runner="r", now=1_002)
    stored = dcache.batch_targets(job_id)
    assert stored is not None
    assert {t.idx: (t.status, t.result) for t in stored} == {i: ("done", r) for i, r in results.items()}
    assert base64.b64decode(results[2]) == BINARY
    assert dcache.check_store().ok


def test_the_headers_option_is_sent_with_the_host(server: FetchServer) -> None:
    sent = json.loads(get(server.url("/headers"), {"headers": {"X-Token": "t1", "User-Agent": "sift-test"}}))
    assert (sent["X-Token"], sent["User-Agent"], sent["Host"]) == (
        "t1",
        "sift-test",
        f"127.0.0.1:{server.port}",
    )
    by_name = json.loads(get(f"http://localhost:{server.port}/headers"))
    assert by_name["Host"] == f"localhost:{server.port}"


@pytest.mark.parametrize("code", [400, 401, 403, 404, 410, 451, 300, 304])
def test_other_4xx_and_unfollowed_statuses_fail(server: FetchServer, code: int) -> None:
    with pytest.raises(Fail) as failed:
        get(server.url(f"/status?code={code}"))
    assert failed.value.error.startswith(f"HTTP {code} ")
    assert server.paths() == [f"/status?code={code}"]


@pytest.mark.parametrize("code", [503, 429])
def test_retry_after_in_seconds_is_a_host_wide_retry(server: FetchServer, code: int) -> None:
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?code={code}&retry_after=1"))
    assert (retried.value.after, retried.value.host_wide) == (1.0, True)
    assert retried.value.error.startswith(f"HTTP {code} ")


@pytest.fixture
def frozen_now() -> Iterator[int]:
    now = 1_800_000_000
    previous = clock.set_test_clock(lambda: now)
    try:
        yield now
    finally:
        clock.set_test_clock(previous)


@pytest.mark.parametrize(
    ("offset", "after"), [(120, 120.0), (-5, 0.0), (RETRY_AFTER_MOST + 10_000, float(RETRY_AFTER_MOST))]
)
def test_retry_after_as_an_http_date(server: FetchServer, frozen_now: int, offset: int, after: float) -> None:
    date = email.utils.formatdate(frozen_now + offset, usegmt=True)
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?code=429&retry_after={date}"))
    assert (retried.value.after, retried.value.host_wide) == (after, True)


def _asctime(when: int) -> str:
    return time.asctime(time.gmtime(when))  # "Tue Jan  5 08:00:00 2027": no zone, the day padded with a space


def _rfc850(when: int) -> str:
    return time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(when))


DATE_FORMS: dict[str, Callable[[int], str]] = {
    "imf-fixdate": lambda when: email.utils.formatdate(when, usegmt=True),
    "rfc850": _rfc850,
    "asctime": _asctime,
}


@pytest.mark.parametrize(
    ("form", "offset", "after"),
    [
        ("asctime", 120, 120.0),
        # the rest of the matrix: each form ahead and past
        pytest.param("imf-fixdate", 120, 120.0, marks=pytest.mark.slow),
        pytest.param("rfc850", 120, 120.0, marks=pytest.mark.slow),
        *(pytest.param(form, -10 * 86400, 0.0, marks=pytest.mark.slow) for form in DATE_FORMS),
    ],
)
def test_retry_after_in_each_http_date_form_is_gmt(
    server: FetchServer, frozen_now: int, form: str, offset: int, after: float
) -> None:
    date = DATE_FORMS[form](frozen_now + offset)
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?code=429&retry_after={quote(date)}"))
    assert (retried.value.after, retried.value.host_wide) == (after, True)


@pytest.mark.parametrize(
    ("value", "after"),
    [
        ("9" * 5000, 3600.0),
        pytest.param("120", 120.0, marks=pytest.mark.slow),
        pytest.param("0", 0.0, marks=pytest.mark.slow),
        pytest.param("007", 7.0, marks=pytest.mark.slow),
    ],
)
def test_retry_after_in_delay_seconds(server: FetchServer, value: str, after: float) -> None:
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?code=503&retry_after={value}"))
    assert (retried.value.after, retried.value.host_wide) == (after, True)


def test_retry_after_past_the_most_waits_the_most(server: FetchServer) -> None:
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?code=503&retry_after={RETRY_AFTER_MOST * 24}"))
    assert retried.value.after == RETRY_AFTER_MOST


@pytest.mark.parametrize(
    "query",
    [
        "code=503",
        "code=429",
        "code=503&retry_after=soon",
        "code=429&retry_after=%C2%B2",  # "²": a digit to str.isdigit(), not to int()
        pytest.param("code=429&retry_after=", marks=pytest.mark.slow),
        "code=500",
        "code=502",
    ],
)
def test_5xx_and_429_without_a_readable_retry_after_are_plain_retries(
    server: FetchServer, query: str
) -> None:
    with pytest.raises(Retry) as retried:
        get(server.url(f"/status?{query}"))
    assert (retried.value.after, retried.value.host_wide) == (None, False)


def test_a_server_slower_than_the_timeout_is_a_retry(server: FetchServer) -> None:
    with pytest.raises(Retry) as retried:
        get(server.url("/slow"), {"timeout": 0.5})
    assert "timed out" in retried.value.error
    assert server.paths() == ["/slow"]


def test_a_body_still_arriving_at_the_timeout_is_a_retry(server: FetchServer) -> None:
    # each byte comes well within the timeout: only the whole fetch's deadline ends it
    with pytest.raises(Retry) as retried:
        get(server.url("/drip"), {"timeout": 1})
    assert "timed out" in retried.value.error


@pytest.mark.slow  # each case waits out its 1 s timeout
@pytest.mark.parametrize("part", ["head", "chunk"])
def test_headers_or_a_chunk_size_line_still_arriving_at_the_timeout_are_a_retry(
    server: FetchServer, part: str
) -> None:
    # a byte every 50 ms for 30 s: each read waits well within the timeout, the whole fetch must not
    started = time.monotonic()
    with pytest.raises(Retry) as retried:
        get(server.url(f"/drip_head?part={part}"), {"timeout": 1})
    assert "timed out" in retried.value.error
    assert time.monotonic() - started < 5  # a bound on a hang (the drip lasts 30 s), not a speed


def test_a_refused_connection_is_a_retry() -> None:
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(Retry) as retried:
            get(f"http://127.0.0.1:{bound.getsockname()[1]}/")
    assert "cannot fetch" in retried.value.error


def test_an_unknown_host_is_a_retry() -> None:
    with pytest.raises(Retry) as retried:
        get("http://no-such-host.invalid/")
    assert "cannot resolve no-such-host.invalid" in retried.value.error


@pytest.mark.parametrize(
    "length",
    [
        "yes",
        "no",
        # unreadable: "²" is a digit to str.isdigit(), not to int(), which refuses over 4,300 digits
        pytest.param(quote("\u00b2"), marks=pytest.mark.slow),
        pytest.param("0" * 5000 + "1", marks=pytest.mark.slow),
    ],
)
def test_a_body_over_the_cap_fails(server: FetchServer, length: str) -> None:
    assert get(server.url(f"/size?n=1000&length={length}"), {"max_bytes": 1000}) == "a" * 1000
    with pytest.raises(Fail) as failed:
        get(server.url(f"/size?n=1001&length={length}"), {"max_bytes": 1000})
    assert "over 1000 bytes (options.max_bytes)" in failed.value.error


def test_the_default_cap(server: FetchServer) -> None:
    assert len(get(server.url(f"/size?n={DEFAULT_MAX_BYTES}&length=no"))) == DEFAULT_MAX_BYTES
    with pytest.raises(Fail):
        get(server.url(f"/size?n={DEFAULT_MAX_BYTES + 1}&length=no"))


def test_the_cap_counts_the_decoded_body(server: FetchServer) -> None:
    gzipped = {"headers": {"Accept-Encoding": "gzip"}, "max_bytes": 10_000}
    assert get(server.url("/gzip?n=10000"), gzipped) == "\ufffd" * 10_000
    with pytest.raises(Fail):  # a few hundred bytes on the wire, a million once inflated
        get(server.url("/gzip?n=1000000"), gzipped)


def test_redirects_are_followed_up_to_the_limit(server: FetchServer) -> None:
    assert get(server.url(f"/hops?n={DEFAULT_MAX_REDIRECTS}")) == "arrived"
    assert len(server.requests) == DEFAULT_MAX_REDIRECTS + 1
    server.requests.clear()
    with pytest.raises(Fail) as failed:
        get(server.url(f"/hops?n={DEFAULT_MAX_REDIRECTS + 1}"))
    assert f"more than {DEFAULT_MAX_REDIRECTS} redirects" in failed.value.error
    assert len(server.requests) == DEFAULT_MAX_REDIRECTS + 1  # the one past the limit is not asked for


def test_max_redirects_option(server: FetchServer) -> None:
    assert get(server.url("/hops?n=2"), {"max_redirects": 2}) == "arrived"
    with pytest.raises(Fail):
        get(server.url("/hops?n=1"), {"max_redirects": 0})
    assert server.paths()[-1] == "/hops?n=1"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_each_redirect_status_is_followed(server: FetchServer, code: int) -> None:
    assert get(server.url(f"/to?code={code}&url=/text")) == "héllo wörld"


def test_credentials_go_to_the_same_origin_only(server: FetchServer) -> None:
    options = {"headers": {"Authorization": "Bearer secret", "X-Other": "kept"}}
    same = json.loads(get(server.url("/to?url=/headers"), options))
    assert (same["Authorization"], same["X-Other"]) == ("Bearer secret", "kept")
    other = json.loads(get(server.url(f"/to?url=http://localhost:{server.port}/headers"), options))
    assert "Authorization" not in other and other["X-Other"] == "kept"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ("[1, 2]", "options"),
        ("not json", "options"),
        ('{"headers": ["a"]}', "options.headers"),
        ('{"headers": {"Bad Name": "x"}}', "options.headers"),
        ('{"headers": {"X-A": "one\\r\\nX-B: two"}}', "options.headers"),
        ('{"headers": {"X-A": 1}}', "options.headers"),
        ('{"headers": {"Host": "elsewhere"}}', "options.headers"),
        ('{"timeout": 0}', "options.timeout"),
        ('{"timeout": "30"}', "options.timeout"),
        ('{"timeout": true}', "options.timeout"),
        ('{"max_bytes": 0}', "options.max_bytes"),
        ('{"max_bytes": 1.5}', "options.max_bytes"),
        (f'{{"max_bytes": {dcache.MAX_RESULT_BYTES + 1}}}', "options.max_bytes"),
        ('{"max_redirects": -1}', "options.max_redirects"),
        ('{"max_redirects": 21}', "options.max_redirects"),
        ('{"body": "bytes"}', "options.body"),
    ],
)
def test_bad_options_fail_the_target_naming_the_option(server: FetchServer, options: str, named: str) -> None:
    with pytest.raises(Fail) as failed:
        fetch(BatchTarget(url=server.url("/text"), options=options), allow_private=True)
    assert failed.value.error.startswith(named + ":")
    assert server.requests == []


@pytest.mark.parametrize("options", ["", "{}", '{"render": true}', None])
def test_empty_and_other_options_are_the_defaults(server: FetchServer, options: str | None) -> None:
    assert fetch(BatchTarget(url=server.url("/text"), options=options), allow_private=True) == "héllo wörld"


def test_urllib3_is_imported_only_with_the_fetcher() -> None:
    check = "import sys, sift.dcache, sift.runner, sift.cli; print('urllib3' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = [sys.executable, "-c", check]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, "False"), result.stderr
