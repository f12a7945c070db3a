"""The one exception type users see: a sentence that names the problem and the fix."""


class OndeviceError(Exception):
    """An error the user can act on. The CLI prints str(err) on one line and exits non-zero."""
