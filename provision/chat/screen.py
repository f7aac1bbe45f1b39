"""A model's streamed text as a terminal may show it: words, newlines and tabs, never control bytes.

A model can emit any code point, and a terminal acts on some of them: ESC sequences recolour,
move the cursor, retitle the window or write to the clipboard (OSC 52), a lone CR rewrites the
line already shown. ``Screen`` removes escape sequences (CSI, OSC, DCS/SOS/PM/APC strings and
two-byte escapes, in their 7-bit and C1 forms) and shows every other C0/C1 control and DEL as
an escape (``\\x0b``), keeping newline and tab. Pieces arrive in any cut, so a sequence begun in
one piece is held until it ends in a later one; what is still open at the end is dropped.
Only what is shown changes: the conversation keeps the model's text as it came.
"""

from __future__ import annotations

ESC = "\x1b"
_KEPT = {"\n", "\t"}
# Strings that run until ST (ESC \ or U+009C); OSC may also end at BEL.
_STRING_INTRO = {"]": "osc", "P": "dcs", "X": "sos", "^": "pm", "_": "apc"}
_C1_INTRO = {"\x9b": "csi", "\x9d": "osc", "\x90": "dcs", "\x98": "sos", "\x9e": "pm", "\x9f": "apc"}
MAX_HELD = 4096  # a sequence longer than this is no terminal's: the held text is dropped and reading goes on


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _shown(ch: str) -> str:
    return ch if ch in _KEPT or not _is_control(ch) else f"\\x{ord(ch):02x}"


class Screen:
    def __init__(self) -> None:
        self._held = ""  # an escape sequence begun but not yet ended
        self._state: str | None = None  # None, "esc", "csi", "osc", "dcs", "sos", "pm", "apc", or those + "-esc"
        self._cr = False  # a CR seen last: shown only if no LF follows

    def feed(self, piece: str) -> str:
        out: list[str] = []
        for ch in piece:
            out.append(self._one(ch))
        return "".join(out)

    def flush(self) -> str:
        """End of the stream: an open sequence is dropped, a trailing CR shown as an escape."""
        self._held, self._state = "", None
        tail = "\\x0d" if self._cr else ""
        self._cr = False
        return tail

    def _one(self, ch: str) -> str:
        state = self._state
        if state is None:
            lead = ""
            if self._cr:
                self._cr = False
                if ch == "\n":
                    return "\n"  # CR LF is a line end
                lead = "\\x0d"
            if ch == "\r":
                self._cr = True
                return lead
            if ch == ESC:
                self._begin("esc", ch)
                return lead
            if ch in _C1_INTRO:
                self._begin(_C1_INTRO[ch], ch)
                return lead
            return lead + _shown(ch)
        if state == "esc" and _is_control(ch):
            self._end()  # ESC then a control: no sequence; the control is read as itself
            return self._one(ch)
        self._held += ch
        if len(self._held) > MAX_HELD:
            self._held, self._state = "", None
            return ""
        if state == "esc":
            if ch == "[":
                self._state = "csi"
            elif ch in _STRING_INTRO:
                self._state = _STRING_INTRO[ch]
            elif "\x20" <= ch <= "\x2f":
                pass  # an intermediate byte: the final one follows
            else:
                self._end()  # a two-byte escape (ESC 7, ESC c, ...), or ESC before anything else: gone
        elif state == "csi":
            if "\x40" <= ch <= "\x7e":
                self._end()
        elif state.endswith("-esc"):  # inside a string, after ESC: "\" ends it, anything else stays inside
            self._state = None if ch == "\\" else state.removesuffix("-esc")
            if self._state is None:
                self._held = ""
        elif ch == "\x9c" or (state == "osc" and ch == "\x07"):
            self._end()
        elif ch == ESC:
            self._state = state + "-esc"
        return ""

    def _begin(self, state: str, ch: str) -> None:
        self._state, self._held = state, ch

    def _end(self) -> None:
        self._state, self._held = None, ""


def shown(text: str) -> str:
    """All of ``text`` as ``Screen`` shows it."""
    screen = Screen()
    return screen.feed(text) + screen.flush()
