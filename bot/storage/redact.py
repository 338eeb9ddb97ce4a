"""Keep database passwords out of every message a user or a log may see.

A database URL carries its password, percent-encoded (``p%40ss`` for
``p@ss``); libraries quote it back in their errors in any of its forms: the
whole URL (Alembic's ConfigParser did), the encoded password, the decoded one.
``redact`` replaces each form with ``***``.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

MASK = "***"
UNPARSABLE_URL = "<database url>"


def hide_password(url: str) -> str:
    """The URL as it may be shown: the password masked (or nothing, when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return UNPARSABLE_URL


def _password_forms(url: str) -> list[str]:
    forms: list[str] = []
    try:
        password = make_url(url).password
    except (ArgumentError, ValueError):
        password = None
    if password:
        forms.append(str(password))
    # The password as written in the URL, between the user's ':' and the last '@'.
    _, _, rest = url.partition("://")
    credentials = rest.rpartition("@")[0]
    if ":" in credentials:
        forms.append(credentials.partition(":")[2])
    # ConfigParser's escaped form (% doubled), should anything echo it.
    forms += [form.replace("%", "%%") for form in list(forms)]
    return sorted({form for form in forms if form}, key=len, reverse=True)


def redact(text: str, url: str) -> str:
    """``text`` with the database URL and its password, in every form, masked."""
    if url:
        text = text.replace(url, hide_password(url))
    for form in _password_forms(url):
        text = text.replace(form, MASK)
    return text
