"""kvserde's exceptions: one class per ``KVS_E*`` status code.

Every failing C call raises a subclass of :class:`Error` carrying the status code
(``.code``, e.g. ``-4``), its name (``.code_name``, ``"KVS_ECORRUPT"``) and the
library's message (``.message``, e.g. ``"pipeline: header CRC mismatch ..."``).
"""

from __future__ import annotations

import builtins


class Error(Exception):
    """A kvserde failure: ``code`` (negative KVS_E* value), ``code_name``, ``message``."""

    code: int = 0
    code_name: str = "KVS_E?"

    def __init__(self, message: str, code: int | None = None):
        if code is not None:
            self.code = code
            self.code_name = _NAMES.get(code, f"KVS_E({code})")
        self.message = message
        super().__init__(f"[{self.code_name}] {message}")


class InvalidError(Error, ValueError):
    """KVS_EINVAL (-1): invalid argument or configuration."""
    code, code_name = -1, "KVS_EINVAL"


class NoSpaceError(Error):
    """KVS_ENOSPC (-2): destination buffer or store too small."""
    code, code_name = -2, "KVS_ENOSPC"


class NoMemoryError(Error, MemoryError):
    """KVS_ENOMEM (-3): an allocation (or the serde wrapper's temp pool) failed."""
    code, code_name = -3, "KVS_ENOMEM"


class CorruptError(Error):
    """KVS_ECORRUPT (-4): input bytes are truncated or malformed."""
    code, code_name = -4, "KVS_ECORRUPT"


class ExistsError(Error):
    """KVS_EEXIST (-5): already exists (e.g. a duplicate registration)."""
    code, code_name = -5, "KVS_EEXIST"


class NotFoundError(Error, LookupError):
    """KVS_ENOTFOUND (-6): no such entry."""
    code, code_name = -6, "KVS_ENOTFOUND"


class ClosedError(Error):
    """KVS_ECLOSED (-7): the object was already closed."""
    code, code_name = -7, "KVS_ECLOSED"


class IOError(Error, builtins.OSError):  # noqa: A001 - the name the issue asks for
    """KVS_EIO (-8): an operating-system call failed (also an ``OSError``)."""
    code, code_name = -8, "KVS_EIO"


class UnsupportedError(Error):
    """KVS_EUNSUPPORTED (-9): this build or CPU cannot serve the request, or an
    unknown blob version / stage."""
    code, code_name = -9, "KVS_EUNSUPPORTED"


class KeyMismatchError(Error):
    """KVS_EKEY (-10): a framed blob written for another object key."""
    code, code_name = -10, "KVS_EKEY"


class AuthError(Error):
    """KVS_EAUTH (-11): authentication failed (wrong key, or tampered data)."""
    code, code_name = -11, "KVS_EAUTH"


_CLASSES = {c.code: c for c in (InvalidError, NoSpaceError, NoMemoryError, CorruptError,
                                ExistsError, NotFoundError, ClosedError, IOError,
                                UnsupportedError, KeyMismatchError, AuthError)}
_NAMES = {code: c.code_name for code, c in _CLASSES.items()}


def error_for(code: int, message: str) -> Error:
    """The exception for status ``code`` with ``message`` (unknown codes: :class:`Error`)."""
    cls = _CLASSES.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
