"""The extension's routes under ``{base_url}kcoral/api/``, each to its handler.

| route | answer |
|---|---|
| `GET servers` | servers with `/health`, `/v1/info`, a `label`, `kernels`, `notebooks` |
| `GET jobs` | recent jobs of every server that offers the jobs API, each tagged with `server` |
| `GET jobs/{id}` | one job's state; `DELETE jobs/{id}` cancels it |
| `GET jobs/{id}/events` | the job's Server-Sent Events, relayed as they arrive |
| `GET jobs/{id}/error` | why a finished job failed: `{kind, message}` of its result's `error` |
| `GET sessions` | every server's sessions (EXTENSIONS §11), tagged with `server`, `observed_at` |
| `GET sessions/{id}` | one session's record; `DELETE sessions/{id}` ends it |

``?server=NAME`` picks one server for the job and session routes; otherwise each server is
asked in turn.

Who can reach these routes: only callers the Jupyter server authenticates (every handler is
a ``base_handler.KCoralHandler``, an ``APIHandler``: its token or login cookie, and the XSRF
check that keeps another site's page from using that cookie to stop a session or cancel a
job), and only from JupyterLab's own page: no other page's script, image or tab
(``Sec-Fetch-Site``, ``base_handler``). They act with the KCoral tokens configured here,
so they see and stop what those tokens' identities may (an admin token: every session).
Job ids from the browser are percent-encoded into one path segment; a session id that is
not a plain token (letters, digits, ``-``, ``_``) is refused before any server is asked,
so no id can reach another upstream route.
"""

from __future__ import annotations

from jupyter_server.utils import url_path_join

from kcoral_jupyter.server_extension.job_events import JobEventsHandler
from kcoral_jupyter.server_extension.jobs import JobErrorHandler, JobHandler, JobsHandler
from kcoral_jupyter.server_extension.server_status import ServersHandler
from kcoral_jupyter.server_extension.sessions import SessionHandler, SessionsHandler


def handlers(base_url: str) -> list[tuple[str, type]]:
    api = url_path_join(base_url, "kcoral", "api")
    job = r"(?P<job_id>[^/]+)"
    session = r"(?P<session_id>[^/]+)"
    return [
        (url_path_join(api, "servers"), ServersHandler),
        (url_path_join(api, "jobs"), JobsHandler),
        (url_path_join(api, "jobs", job), JobHandler),
        (url_path_join(api, "jobs", job, "events"), JobEventsHandler),
        (url_path_join(api, "jobs", job, "error"), JobErrorHandler),
        (url_path_join(api, "sessions"), SessionsHandler),
        (url_path_join(api, "sessions", session), SessionHandler),
    ]
