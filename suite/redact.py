"""Credentials kept out of everything the suite shows or records, redacted once where the text is made.

A tracking URI keeps its password only where it is used to connect (:mod:`suite.tracking`); its shown and recorded
form is :func:`redact_uri`'s (``postgresql://user:***@host/db``, ``?password=***``). A command line is recorded as
:func:`redact_argv` gives it, and an environment variable whose name looks like a credential (:func:`is_secret_name`)
is recorded as set, never with its value (:func:`redact_environment`). :func:`redact_text` finds the same shapes in
any text (an error message from a database driver quoting its URL), the last guard of the terminal sink.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

#: What stands in place of a credential.
REDACTED = "***"
#: What an environment variable holding a credential is recorded as.
SET_NOT_RECORDED = "<set; value not recorded>"

#: Words of a name that mark a credential (``NCCL_IB_AUTH_TOKEN``, ``NVIDIA_API_KEY``, ``password`` in a query).
_SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "PWD", "AUTH",
                           "CREDENTIAL", "CREDENTIALS", "PRIVATE", "SIGNATURE", "COOKIE", "SESSION", "SAS"})
#: Fragments that mark a credential even inside a word (``MYTOKEN``, ``DBPASSWORD``, ``X_SECRETS``).
_SECRET_FRAGMENTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY", "PRIVATEKEY")


def is_secret_name(name: str) -> bool:
    """Whether a variable, parameter or query key named ``name`` looks like it holds a credential: one of its words
    (split at ``_``, ``-``, ``.`` and case changes) is TOKEN, KEY, SECRET, PASSWORD, AUTH, CREDENTIAL..., or it
    contains TOKEN, SECRET, PASSWORD, CREDENTIAL or APIKEY anywhere."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    words = {word for word in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if word}
    upper = name.upper()
    return bool(words & _SECRET_WORDS) or any(fragment in upper for fragment in _SECRET_FRAGMENTS)


# scheme://[user[:password]@]host... : the user-info ends at the last "@" before the path, query or fragment
_AUTHORITY = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^/?#\s\"']*)")
# key=value in a query string or a libpq/ODBC keyword list (";" or "&" separated)
_KEY_VALUE = re.compile(r"(?P<lead>(?:^|[?&;\s])-{0,2}(?P<key>[A-Za-z][A-Za-z0-9_.\-]*)=)(?P<value>[^&;#\s\"']*)")


def _redact_authority(match: re.Match[str]) -> str:
    authority = match.group("authority")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return match.group(0)
    user, colon, _ = userinfo.partition(":")
    return f"{match.group('scheme')}{user}{':' + REDACTED if colon else ''}@{host}"


def _redact_value(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("key")) or not match.group("value"):
        return match.group(0)
    return match.group("lead") + REDACTED


def redact_text(text: str) -> str:
    """``text`` with every URI's password (``scheme://user:PASSWORD@``) and every value of a secret-looking
    ``key=value`` (``?password=…``, ``;Pwd=…``, ``--token=…``) replaced by :data:`REDACTED`; the user and everything
    else kept."""
    if "=" not in text and "@" not in text:
        return text
    text = _AUTHORITY.sub(_redact_authority, text)
    return _KEY_VALUE.sub(_redact_value, text)


def redact_uri(uri: str) -> str:
    """A URI as it may be shown or recorded: the user kept, the password and secret query values ``***``."""
    return redact_text(uri)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line as it may be recorded or shown: each word through :func:`redact_text`, and the word after an
    option whose name looks like a credential (``--password X``, ``--token X``) replaced whole."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if word.startswith("-") and "=" not in word and is_secret_name(word.lstrip("-")):
            hide_next = True
        out.append(redact_text(word))
    return out


def redact_environment(variables: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as they may be recorded: a credential-looking name's value is
    :data:`SET_NOT_RECORDED`; every other value through :func:`redact_text` (a URI holding a password)."""
    return {name: SET_NOT_RECORDED if is_secret_name(name) else redact_text(value)
            for name, value in variables.items()}


def userinfo_credentials(uri: str) -> tuple[str, tuple[str, str] | None]:
    """``uri`` without its user-info, and the (user, password) it held (``None`` where it held none), percent-decoded:
    what an HTTP client sends as basic authentication, as MLflow's own client does."""
    import urllib.parse

    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (urllib.parse.unquote(user), urllib.parse.unquote(password))
