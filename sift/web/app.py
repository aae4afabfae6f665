"""The dashboard's WSGI app: pages that read the store, their live fragments, and the actions."""

from __future__ import annotations

import dataclasses
import hmac
import secrets
import time
import urllib.parse
from typing import Any

import flask
from werkzeug.wrappers import Response

from sift import dcache
from sift.dcache import BatchError, InvalidBatchInput, JobNotFound
from sift.dcache.validation import MAX_INT

from . import queries
from .actions import ACTIONS, ActionContext

__all__ = ["Settings", "create_app"]

#: How long a claim's heartbeat may be silent before the pages call it stale, by default (the Runner's).
STALE_AFTER = 60
#: The header of a live fragment's request, and the query parameter that asks for one.
LIVE_PARAM = "_live"

_SECURITY_HEADERS = {
    # Only the app's own script and style run: an injected <script> would not, even if it were not escaped.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What ``create_app`` was given."""

    token: str | None
    read_only: bool
    budget: int | None
    stale_after: int


def create_app(
    db_url: str | None,
    *,
    token: str | None = None,
    read_only: bool = False,
    budget: int | None = None,
    stale_after: int = STALE_AFTER,
    secret_key: bytes | None = None,
) -> flask.Flask:
    """The dashboard as a Flask (WSGI) app, mountable under a prefix.

    ``db_url`` is opened with ``open_db(db_url, create=False, readonly=read_only)``; None uses the store
    this process opened already. With ``token``, actions need it (``Authorization: Bearer TOKEN``, or the
    login form's cookie); without one, anyone who reaches the app may act. ``read_only`` shows no actions
    and refuses them (403). ``budget`` (bytes) is the limit the overview shows the stored results against;
    ``stale_after`` (seconds) is when a silent claim counts as stale. ``secret_key`` signs the session
    cookie (random when None: give every worker process the same one)."""
    if token is not None and (not isinstance(token, str) or not token):
        raise dcache.InvalidBatchInput("token", "must be a non-empty str or None")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise dcache.InvalidBatchInput("budget", "must be a positive int or None")
    if isinstance(stale_after, bool) or not isinstance(stale_after, int) or stale_after <= 0:
        raise dcache.InvalidBatchInput("stale_after", "must be a positive int")
    if db_url is not None:
        dcache.open_db(db_url, create=False, readonly=read_only)
    app = flask.Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_bytes(32),
        SESSION_COOKIE_NAME="sift_web",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
    )
    settings = Settings(token, read_only, budget, stale_after)
    app.extensions["sift_web"] = settings
    _routes(app, settings)
    return app


def _csrf() -> str:
    """The form token kept in this browser's signed cookie, made on first use."""
    if "csrf" not in flask.session:
        flask.session["csrf"] = secrets.token_urlsafe(32)
    return str(flask.session["csrf"])


def _same(given: Any, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _bearer(settings: Settings) -> bool:
    """The request carries the token in its Authorization header (which no other site's form can send)."""
    header = flask.request.headers.get("Authorization", "")
    return settings.token is not None and header.startswith("Bearer ") and _same(header[7:], settings.token)


def _logged_in(settings: Settings) -> bool:
    return settings.token is None or flask.session.get("auth") is True


def _local(target: str | None, default: str) -> str:
    """A redirect back into this app only: a path, never another site (``//host`` or a scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def _here() -> str:
    """This page's path under the app's mount point, with its query but not the live fragment's flag."""
    request = flask.request
    query = urllib.parse.urlencode([(k, v) for k, v in request.args.items(multi=True) if k != LIVE_PARAM])
    return request.script_root + request.path + (f"?{query}" if query else "")


def _routes(app: flask.Flask, settings: Settings) -> None:
    def page(name: str, **values: Any) -> Any:
        if flask.request.args.get(LIVE_PARAM) == "1":
            response = flask.make_response(flask.render_template(f"{name}_live.html", **values))
            response.headers["X-Sift-Live"] = "1"
            return response
        return flask.render_template(f"{name}.html", live_page=True, **values)

    @app.template_filter("utc")
    def utc(unix: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))

    @app.context_processor
    def common() -> dict[str, Any]:
        return {
            "settings": settings,
            "can_act": not settings.read_only and _logged_in(settings),
            "needs_login": not settings.read_only and not _logged_in(settings),
            "csrf_token": _csrf,
            "actions": ACTIONS,
            "here": _here(),
        }

    @app.after_request
    def headers(response: Response) -> Response:
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/")
    def overview() -> Any:
        return page("overview", o=queries.overview(budget=settings.budget, stale_after=settings.stale_after))

    @app.get("/jobs")
    def jobs() -> Any:
        args = flask.request.args
        filters = {name: args.get(name, "")[:200] for name in ("status", "caller", "search")}
        found = queries.jobs_page(
            status=filters["status"],
            caller=filters["caller"],
            search=filters["search"],
            after=args.get("after", "")[:200],
        )
        return page("jobs", found=found, filters=filters, statuses=[s.value for s in dcache.JobStatus])

    @app.get("/jobs/<path:job_id>")
    def job(job_id: str) -> Any:
        found = dcache.batch_job(job_id)
        if found is None:
            return flask.render_template("missing.html", what="job", name=job_id), 404
        after = flask.request.args.get("after", "")
        targets, next_after = queries.target_page(
            job_id, after=min(int(after), MAX_INT) if after.isascii() and after.isdigit() else -1
        )
        return page(
            "job", job=found, targets=targets, next_after=next_after, paused=queries.job_pause_state(found)
        )

    @app.get("/callers")
    def callers() -> Any:
        rows, rest = queries.callers()
        return page("callers", rows=rows, rest=rest)

    @app.get("/hosts")
    def hosts() -> Any:
        rows, rest = queries.hosts()
        return page("hosts", rows=rows, rest=rest, default=queries.default_policy())

    @app.get("/runners")
    def runners() -> Any:
        return page("runners", rows=queries.runners(settings.stale_after))

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        back = _local(flask.request.values.get("next"), flask.url_for("overview"))
        if flask.request.method == "GET":
            return flask.render_template("login.html", next=back, failed=False)
        form = flask.request.form
        if not _same(form.get("csrf"), _csrf()):
            flask.abort(403)
        if settings.token is not None and not _same(form.get("token"), settings.token):
            return flask.render_template("login.html", next=back, failed=True), 403
        flask.session["auth"] = True
        return flask.redirect(back, 303)

    @app.post("/logout")
    def logout() -> Any:
        if not _same(flask.request.form.get("csrf"), _csrf()):
            flask.abort(403)
        flask.session.clear()
        return flask.redirect(flask.url_for("overview"), 303)

    @app.post("/actions/<name>")
    def act(name: str) -> Any:
        form = flask.request.form
        subject = form.get("subject", "")
        # a script's call (a bearer token, right or wrong): its refusals are JSON, as its results are; not a
        # browser's behind a proxy that sends its own Basic credentials
        scripted = flask.request.headers.get("Authorization", "").startswith("Bearer ")

        def refuse(status: int, error: str) -> Any:
            if scripted:
                return flask.jsonify({"action": name, "subject": subject, "error": error}), status
            flask.abort(status)

        if settings.read_only:
            return refuse(403, "this dashboard is read-only")
        bearer = _bearer(settings)
        if not bearer and not (_logged_in(settings) and _same(form.get("csrf"), _csrf())):
            return refuse(403, "the token is missing or wrong")
        action = ACTIONS.get(name)
        if action is None:
            return refuse(404, f"no action {name!r}")
        try:
            result = action.call(ActionContext(subject, settings.stale_after, form.get("value", "")))
        except JobNotFound as exc:
            return refuse(404, str(exc))
        except BatchError as exc:
            if scripted:
                return refuse(400, str(exc))
            return flask.render_template("failed.html", action=name, error=str(exc)), 400
        if bearer or flask.request.headers.get("X-Sift-Fetch") == "1":
            return flask.jsonify({"action": name, "subject": subject, "result": result})
        return flask.redirect(_local(form.get("next"), flask.url_for("overview")), 303)

    @app.errorhandler(InvalidBatchInput)
    def invalid(exc: InvalidBatchInput) -> tuple[str, int]:
        return flask.render_template("failed.html", action="request", error=str(exc)), 400

    @app.errorhandler(403)
    def forbidden(_: Any) -> tuple[str, int]:
        return flask.render_template("forbidden.html"), 403
