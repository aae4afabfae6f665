"""The operator's dashboard: a WSGI app (Flask) over the store, with live pages and token-guarded actions.
Needs the ``web`` extra (``pip install sift[web]``)."""

from .actions import ACTIONS, Action, ActionContext
from .app import Settings, create_app

__all__ = ["ACTIONS", "Action", "ActionContext", "Settings", "create_app"]
