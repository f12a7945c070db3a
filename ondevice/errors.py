"""The one exception type users see: a sentence that names the problem and the fix."""


class OndeviceError(Exception):
    """An error the user can act on. The CLI prints str(err) on one line and exits non-zero."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), at most 300 characters:
    what a one-line report of a failed source or tool can quote."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:300]
