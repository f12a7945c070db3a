"""Text that becomes tokens must be Unicode that UTF-8 can hold.

A prompt given on the command line in bytes that are not UTF-8 reaches Python as surrogates
(U+DC80..U+DCFF, one per byte), and a chat template or a JSON `\ud800` can make a lone surrogate:
encoding either for llama.cpp raised UnicodeEncodeError (a traceback in the CLI, a 500 in the server).
`check_text` turns them into one line that says where.
"""

from __future__ import annotations

from ondevice.errors import OndeviceError


def check_text(text: str, what: str, fix: str = "give it as UTF-8 text") -> str:
    """`text`, if UTF-8 can encode it; else an OndeviceError: `what` holds the first bad character there; `fix`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, carried as a surrogate (surrogateescape)
            found = f"the byte 0x{code - 0xDC00:02X}, which is not UTF-8,"
        else:
            found = f"a lone surrogate (U+{code:04X}), which is not text,"
        raise OndeviceError(f"{what} holds {found} at character {err.start:,}; {fix}.") from None
    return text
