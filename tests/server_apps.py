"""Small web apps run under real app servers by the tests (uvicorn, gunicorn): each opens the store named
by ``$SIFT_DB`` at start, as the web-app example of docs/how-to/web-app.md does.

- :func:`fastapi_app`: submit and poll routes as plain ``def`` endpoints, which FastAPI runs on its thread
  pool (anyio's default: 40 threads); ``$SIFT_MAX_CONNECTIONS`` is the store's ``max_connections``.
- :func:`create_one`: a create route for the multiprocess metrics app of docs/how-to/operating.md (Flask).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from sift import dcache


def _open() -> None:
    target = os.environ["SIFT_DB"]
    connections = os.environ.get("SIFT_MAX_CONNECTIONS")
    dcache.open_db(target, max_connections=int(connections) if connections else None)


def _job(caller: str, idem_key: str, total: int) -> dcache.BatchJob:
    now = dcache.unix_now()
    return dcache.BatchJob(
        id=uuid.uuid4().hex,
        caller=caller,
        caller_class=dcache.CallerClass.FLEET,
        idem_key=idem_key,
        status=dcache.JobStatus.QUEUED,
        targets_total=total,
        created_at=now,
        lease=now,
    )


def fastapi_app() -> Any:
    from fastapi import FastAPI, HTTPException

    _open()
    app = FastAPI()

    @app.post("/jobs", status_code=202)
    def submit(body: dict[str, Any]) -> dict[str, Any]:
        urls = body["urls"]
        targets = (dcache.BatchTarget(idx=i, url=url, options={}) for i, url in enumerate(urls))
        job_id, created = dcache.submit_batch_job(_job("api", body["key"], len(urls)), targets, 3600)
        return {"id": job_id, "created": created}

    @app.get("/jobs/{job_id}")
    def poll(job_id: str) -> dict[str, Any]:
        job = dcache.batch_job(job_id)
        if job is None:
            raise HTTPException(404)
        targets = dcache.batch_targets(job_id) or []
        dcache.touch_batch_job(job_id)
        return {"status": job.status, "targets": [t.status for t in targets]}

    return app


def create_one() -> tuple[dict[str, Any], int]:
    """A Flask view: create a job of one target; answer with the worker's pid."""
    dcache.create_batch_job(
        _job("api", "", 1), [dcache.BatchTarget(idx=0, url="https://a.example/", options={})]
    )
    return {"pid": os.getpid()}, 201
