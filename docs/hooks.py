"""MkDocs hook: the docstrings' reST roles (``:func:`x```) read as plain code in the generated reference."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:func|class|mod|meth|attr|exc|data|obj):<code>~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub("<code>", html)
