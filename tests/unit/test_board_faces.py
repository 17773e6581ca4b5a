"""Every face a GPU row can show (FaceState) has a glyph, a colour, a word and a legend line on
the board; a state this version does not know is shown as it is, with ``?`` and no colour."""

from __future__ import annotations

from gpuclaim.board.cells import face, glyph, glyph_of, reason_style, short_word, state_text
from gpuclaim.board.dialogs import HELP_STATES
from gpuclaim.core.states import FaceState, face_style

UNKNOWN = "hibernating"  # a state some newer gpuclaim might write


def test_every_face_has_its_own_glyph() -> None:
    glyphs = [glyph(state) for state in FaceState]
    assert all(len(g) == 1 and g != "?" for g in glyphs), glyphs
    assert len(set(glyphs)) == len(glyphs), glyphs
    assert [glyph_of(state.value) for state in FaceState] == glyphs


def test_every_face_has_a_word_and_a_colour() -> None:
    for state in FaceState:
        for short in (False, True):
            text = state_text(state.value, short=short)
            assert text.plain == f"{glyph(state)} {short_word(state) if short else state.value}"
            assert str(text.style) == face_style(state) != ""
        assert reason_style(state.value) == face_style(state)
    assert short_word(FaceState.BUSY_UNCLAIMED) == "busy"


def test_an_unknown_state_is_shown_as_it_is() -> None:
    assert glyph_of(UNKNOWN) == "?"
    for short in (False, True):
        text = state_text(UNKNOWN, short=short)
        assert (text.plain, str(text.style)) == (f"? {UNKNOWN}", "")
    assert reason_style(UNKNOWN) == "dim"


def test_every_face_has_a_legend_line_and_the_help_lists_faces_once() -> None:
    lines = {state: face(state).meaning for state in FaceState}
    assert all(line and not line.endswith("\n") for line in lines.values()), lines
    assert len(set(lines.values())) == len(lines)
    assert list(HELP_STATES) == list(FaceState)  # the help explains every face, once
