"""The web app: submit a batch of URLs, poll it, cancel it. Each gunicorn worker builds it once with
``create_app(db_url)``; every error of the store becomes a JSON answer (``error``, and ``field`` when one
is at fault).

- ``POST /v1/jobs`` with ``{"urls": [...], "options": {...}}`` and an ``Idempotency-Key`` header: 202 and
  the new job's id, or 200 and the id of the job this caller already submitted with that key and the same
  URLs and options; 409 if that key's job was made from another request.
- ``GET /v1/jobs/<id>``: the job and every target's result (a page of them with ``?after=&limit=``);
  reading keeps the job alive (its lease). ``?wait=SECONDS`` (a long poll, at most ``MAX_WAIT`` seconds):
  the answer comes when the job is finished or its status or count of finished targets moves, or at the
  end of the wait; each waiting request holds a worker (or a thread of one) meanwhile.
- ``POST /v1/jobs/<id>/cancel``: a queued or running job becomes cancelled and its unfinished targets
  failed (no more of them are fetched); 409 for a job that is finished already.

The caller is the ``X-Caller`` header, a stand-in for real authentication: a caller sees only its own jobs.

What the app takes: a body of at most ``MAX_BODY_BYTES`` (413 past it), 1 to ``MAX_URLS`` URLs, each an
absolute ``http`` or ``https`` URL with a host and at most ``MAX_URL_BYTES`` bytes, whose host is not an
address outside the public internet (``http://169.254.169.254/``, ``http://10.0.0.1/``): 400 naming
``urls[i]`` otherwise. It cannot tell where a host name leads: a name may resolve to a private or
loopback address, now or later. The fetching side must check the address it connects to (refuse
loopback, private, link-local, multicast and reserved addresses, and connect to the address it checked),
and check every redirect the same way.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, jsonify, request
from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app, multiprocess
from sift import dcache
from sift.dcache import JobStatus, metrics
from werkzeug.exceptions import HTTPException
from werkzeug.middleware.dispatcher import DispatcherMiddleware

TTL = 24 * 3600  # seconds a job stays pollable after its last use; the runner sweeps older ones
MAX_URLS = 1000  # targets in one job
MAX_URL_BYTES = 2048  # one URL, in UTF-8 bytes: what browsers and most servers take
MAX_BODY_BYTES = 4 * 2**20  # one request body: MAX_URLS URLs of MAX_URL_BYTES, and their options
SCHEMES = ("http", "https")  # the only URLs the fetcher follows
MAX_WAIT = 30.0  # seconds one long poll may wait: below proxies' and load balancers' idle timeouts
LIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)

log = logging.getLogger("fetchapp.web")

Answer = tuple[Response, int]


def create_app(db_url: str) -> Flask:
    """Each web worker, at its start: open the store at ``db_url`` (a SQLite path or a ``postgresql://``
    URL; it must exist, ``sift init`` makes it, so a mistyped one fails the worker's boot) and build the
    app. Safe to call again in one process (tests): the store is reopened, the metrics registered once."""
    dcache.open_db(db_url, create=False)
    return build_app()


def build_app() -> Flask:
    """The app on the store this process has open (``create_app``, or a test's ``sift_store``)."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES  # a larger body is 413, never read
    app.add_url_rule("/v1/jobs", view_func=submit, methods=["POST"])
    app.add_url_rule("/v1/jobs/<job_id>", view_func=poll, methods=["GET"])
    app.add_url_rule("/v1/jobs/<job_id>/cancel", view_func=cancel, methods=["POST"])
    app.add_url_rule("/healthz", view_func=health, methods=["GET"])
    app.register_error_handler(dcache.BatchError, store_error)
    app.register_error_handler(HTTPException, http_error)
    scrape = make_wsgi_app(metrics_registry())
    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/metrics": scrape})  # type: ignore[method-assign]
    return app


def metrics_registry() -> CollectorRegistry:
    """What ``/metrics`` shows. Under gunicorn, with ``PROMETHEUS_MULTIPROC_DIR`` set, every worker's counts
    (live and recycled); otherwise this process's. ``metrics.register`` may be called again."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        metrics.register(registry)
        return registry
    metrics.register(REGISTRY)
    return REGISTRY


def answer(status: int, body: dict[str, Any]) -> Answer:
    return jsonify(body), status


def caller() -> str:
    """The caller, from ``X-Caller``; a request without one is refused (401) before any store call."""
    name = request.headers.get("X-Caller", "")
    if not name:
        raise Unauthorized()
    return name


class Unauthorized(HTTPException):
    code = 401
    description = "X-Caller: the header naming the caller is required"


def submit() -> Answer:
    """Create the job, or find the one this caller submitted with the same ``Idempotency-Key`` (within
    ``TTL``) and the same request: the lookup and the create are one transaction, so a burst of retries
    makes one job. The key of a job made from other URLs or options is 409 (``IdempotencyConflict``)."""
    who = caller()
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return answer(400, {"field": "body", "error": "body: must be a JSON object with a urls list"})
    urls = body.get("urls")
    if not isinstance(urls, list) or not urls or len(urls) > MAX_URLS:
        return answer(400, {"field": "urls", "error": f"urls: must be a list of 1 to {MAX_URLS} URLs"})
    for i, url in enumerate(urls):
        if problem := url_problem(url):
            return answer(400, {"field": f"urls[{i}]", "error": f"urls[{i}]: {problem}"})
    job_id, created = dcache.submit(
        who,
        urls,
        idem_key=request.headers.get("Idempotency-Key", ""),
        options=body.get("options", {}),
        ttl=TTL,
    )  # its errors: store_error
    response, status = answer(202 if created else 200, {"id": job_id, "created": created})
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return response, status


def url_problem(url: Any) -> str | None:
    """Why ``url`` is not one the app takes (None if it is): an absolute http(s) URL with a host, short."""
    if not isinstance(url, str):
        return "must be a string"
    if len(url.encode("utf-8", "surrogatepass")) > MAX_URL_BYTES:
        return f"must be at most {MAX_URL_BYTES} bytes"
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:  # a malformed IPv6 literal or port
        return f"is not a URL: {exc}"
    if parts.scheme.lower() not in SCHEMES:
        return f"must be an http or https URL, not {parts.scheme or 'a relative one'}"
    if not host:
        return "must name a host"
    try:  # url_host writes every spelling of an address as one (0x7f000001, 127.1: 127.0.0.1)
        address = ipaddress.ip_address(dcache.url_host(url).strip("[]"))
    except ValueError:  # a name: where it leads is the fetcher's to check, at connect time
        return None
    if not address.is_global:
        return f"must not name a private, loopback, link-local or reserved address ({address})"
    return None


def poll(job_id: str) -> Answer:
    """The job and its targets' results, all of them or the page ``?after=&limit=`` asks for (``next``:
    the next page's query, while a full page was read). Reading touches the job: a polled job is never
    swept."""
    who = caller()
    after, limit = page_arguments()
    wait = wait_argument()
    job = dcache.batch_job(job_id)
    if job is None or job.caller != who:  # the store never filters by caller: the API does
        raise dcache.JobNotFound(job_id)
    if wait:
        job = dcache.wait_for_batch_job(job_id, timeout=wait, since=job)
        if job is None:  # swept while waiting
            raise dcache.JobNotFound(job_id)
    targets = dcache.batch_targets(job_id, after=after, limit=limit) or []
    dcache.touch_batch_job(job_id)  # JobNotFound if swept since the read: 404 too
    body = {
        "id": job.id, "status": job.status, "error": job.error,
        "done": job.targets_done, "total": job.targets_total,
        "results": [
            {"idx": t.idx, "url": t.url, "status": t.status, "result": t.result, "error": t.error}
            for t in targets
        ],
    }  # fmt: skip
    if limit is not None and len(targets) == limit:
        body["next"] = f"?after={targets[-1].idx}&limit={limit}"
    return answer(200, body)


def page_arguments() -> tuple[int | None, int | None]:
    """``after`` and ``limit`` from the query string, as ints (None when absent); the store checks their
    range (``InvalidBatchInput``: 400 naming the field)."""
    found: list[int | None] = []
    for name in ("after", "limit"):
        text = request.args.get(name)
        if text is not None and not text.lstrip("-").isdigit():
            raise dcache.InvalidBatchInput(name, f"must be a whole number, got {text!r}")
        found.append(None if text is None else int(text))
    return found[0], found[1]


def wait_argument() -> float:
    """``wait`` from the query string: seconds from 0 to ``MAX_WAIT`` (0 when absent)."""
    text = request.args.get("wait")
    if text is None:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WAIT:  # NaN too
        problem = f"must be a number of seconds from 0 to {MAX_WAIT:g}, got {text!r}"
        raise dcache.InvalidBatchInput("wait", problem)
    return seconds


def cancel(job_id: str) -> Answer:
    """A queued or running job of this caller becomes cancelled and its unfinished targets failed, in one
    transaction (``cancel_batch_job``): a runner finishing the job at the same moment and this cancel
    cannot both win, and the runner's later writes are refused. A finished job is 409."""
    who = caller()
    job = dcache.batch_job(job_id)
    if job is None or job.caller != who:
        raise dcache.JobNotFound(job_id)
    if dcache.cancel_batch_job(job_id, reason=f"cancelled by {who}"):  # JobNotFound if swept meanwhile
        return answer(200, {"id": job_id, "status": JobStatus.CANCELLED.value})
    job = dcache.batch_job(job_id)
    status = job.status if job is not None else JobStatus.CANCELLED.value
    return answer(409, {"id": job_id, "status": status, "error": f"status: the job is {status} already"})


def health() -> Answer:
    """200 when the store answers a read (the live jobs' count), else 503 (StoreUnavailable)."""
    return answer(200, {"live_jobs": dcache.live_batch_jobs_total()})


def store_error(exc: dcache.BatchError) -> Answer:
    """The store's errors as HTTP answers: bad input 400 naming the field, a missing job 404, a duplicate
    id or an idempotency key used for another request 409, a store that cannot be used now 503 (logged,
    with Retry-After); anything else is a bug, 500."""
    if isinstance(exc, dcache.InvalidBatchInput):
        return answer(400, {"field": exc.field, "error": str(exc)})
    if isinstance(exc, (dcache.JobNotFound, dcache.TargetNotFound)):
        return answer(404, {"error": "no such job"})
    if isinstance(exc, (dcache.DuplicateJob, dcache.IdempotencyConflict)):
        return answer(409, {"field": exc.field, "error": str(exc)})
    if isinstance(exc, dcache.StoreUnavailable):
        log.error("store unavailable: %s", exc, exc_info=exc)
        response, status = answer(503, {"error": "the job store is unavailable; try again later"})
        response.headers["Retry-After"] = "5"
        return response, status
    log.error("store error: %s", exc, exc_info=exc)
    return answer(500, {"error": "internal error"})


def http_error(exc: HTTPException) -> Answer:
    """Flask's own answers (no such route, wrong method, 401) as JSON too."""
    return answer(exc.code or 500, {"error": exc.description or exc.name})
