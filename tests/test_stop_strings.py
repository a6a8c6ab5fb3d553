"""domino.stop_strings: where a generation stops on a stop string, checked step by step on
the text the new tokens can have changed, is where decoding whole prefixes says it is."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domino.stop_strings import stop_length, text_until_stop


@functools.cache
def tokenizer():
    from transformers import AutoTokenizer

    from domino.loading import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


def first_stop(tok, ids, stop):
    """The oracle: the fewest leading tokens whose whole text holds a stop string."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        if any(s and s in text for s in stop):
            return k
    return None


def stepped_stop(data, tok, ids, stops):
    """Where stop_length stops ``ids`` grown by random steps of 1-9 tokens, as rounds grow
    an output, each step checked with the tokens before it as clean."""
    clean, got = 0, None
    while clean < len(ids) and got is None:
        n = min(len(ids), clean + data.draw(st.integers(1, 9), label="step"))
        got = stop_length(tok, ids[:n], stops, clean)
        clean = n
    return got


def awkward_ids(tok):
    """Token ids of text with multi-byte characters (split across byte tokens), spaces,
    newlines and code, and special tokens (which decode to nothing)."""
    pieces = ["déjà vu ", "日本語の文", " 🙂🙃 ", "def f(x):\n    return x", "  \t ", "naïve café", "Ωμέγα"]
    ids = [i for p in pieces for i in tok.encode(p, add_special_tokens=False)]
    return ids + list(tok.all_special_ids)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_step_by_step_is_the_whole_prefix_answer(data):
    """Random outputs (ids of awkward text and random ids), grown by random steps as rounds
    grow them, each step checked with the tokens before it as clean: the generation stops
    at the oracle's token, for stop strings taken from the text (across a step's boundary
    too) and for ones not in it."""
    tok = tokenizer()
    pool = awkward_ids(tok)
    ids = data.draw(st.lists(st.one_of(st.sampled_from(pool), st.integers(0, tok.vocab_size - 1)),
                             min_size=1, max_size=80), label="ids")
    text = tok.decode(ids, skip_special_tokens=True)
    stops = []
    for _ in range(data.draw(st.integers(1, 3), label="stop strings")):
        if text and data.draw(st.booleans(), label="from the text"):
            i = data.draw(st.integers(0, len(text) - 1), label="start")
            stops.append(text[i:i + data.draw(st.integers(1, 12), label="length")])
        else:
            stops.append(data.draw(st.text(min_size=1, max_size=6), label="stop"))
    assert stepped_stop(data, tok, ids, stops) == first_stop(tok, ids, stops)


def test_a_step_decodes_only_the_tail():
    """At 3,000 tokens a step with one new token decodes a few dozen tokens, not all of them
    (the whole output was decoded at every step before), and still finds a stop string
    the new token completes, across the step's boundary."""
    tok = tokenizer()
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 300, add_special_tokens=False)[:3000]
    decoded = []

    class Counting:
        def decode(self, slice_ids, skip_special_tokens=True):
            decoded.append(len(slice_ids))
            return tok.decode(slice_ids, skip_special_tokens=skip_special_tokens)

    assert stop_length(Counting(), ids, ["STOP"], clean=len(ids) - 1) is None
    assert max(decoded) < 80
    tail = tok.encode(" lazy cat", add_special_tokens=False)
    decoded.clear()
    assert stop_length(Counting(), ids + tail, ["dog. lazy cat"], clean=len(ids)) == len(ids) + len(tail)
    assert stop_length(Counting(), ids + tail, ["dog. lazy cow"], clean=len(ids)) is None


@pytest.mark.parametrize("stop, expected", [(["b", "c"], "a"), (["c", "b"], "a"), ([""], "abc"), ([], "abc"),
                                            (["bc", "ab"], ""), (["ab", "bc"], "")])
def test_text_is_cut_before_the_first_stop_string(stop, expected):
    class Chars:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i) for i in ids)

    assert text_until_stop(Chars(), [0, 1, 2], stop) == expected


def test_a_stop_string_holding_the_replacement_character_stops_where_one_token_at_a_time_does():
    """A prefix that ends inside a multi-byte character decodes with U+FFFD at its end; the
    next token completes the character and the U+FFFD is gone. A stop string holding it
    matches that prefix (where one-token-at-a-time decoding stops), so a step completing
    the character in the same round must still stop there: the whole text holds no U+FFFD,
    and bisection assumed longer prefixes extend shorter ones (it returned None)."""
    tok = tokenizer()
    ids = tok.encode("\n\U0001f431, cat \u65e5\u672c", add_special_tokens=False)
    texts = [tok.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    assert any(t.endswith("\ufffd") for t in texts) and "\ufffd" not in texts[-1]  # the case itself
    for stop in (["\ufffd"], ["zzz", "\ufffd"], ["\n\ufffd"]):
        expected = first_stop(tok, ids, stop)
        assert expected is not None
        for step in (1, 2, 3, len(ids)):
            clean, got = 0, None
            while clean < len(ids) and got is None:
                n = min(len(ids), clean + step)
                got = stop_length(tok, ids[:n], stop, clean)
                clean = n
            assert got == expected, (stop, step)


def test_a_step_completing_a_character_begun_before_it_finds_the_stop_string():
    """A stop string (an emoji, one character of 4 bytes over 3 byte tokens) begun by the
    clean tokens and completed by the step's one new token: the slice decoded for the check
    must reach back past the character's first byte, which the margin of EDGE_CHARS
    characters guarantees (a slice of only the stop string's length decodes to byte
    fragments and misses it)."""
    tok = tokenizer()
    ids = tok.encode("🦈", add_special_tokens=False)
    assert len(ids) == 3 and tok.decode(ids[:2]) == "\ufffd"
    assert stop_length(tok, ids, ["🦈"], clean=2) == 3 == first_stop(tok, ids, ["🦈"])
    prefix = tok.encode("fish: ", add_special_tokens=False)
    assert stop_length(tok, prefix + ids, ["🦈"], clean=len(prefix) + 2) == len(prefix) + 3


class CleanUpDecoder:
    """A decoder whose text of a longer prefix need not extend a shorter one's: pieces
    joined, then the spaces before punctuation removed as HF's ``clean_up_tokenization``
    does (``clean_up_tokenization_spaces=True``, WordPiece and Unigram tokenizers): "a " is
    the text of [a, " "], and "a." that of [a, " ", "."]."""

    PIECES = ["a", "b", " ", ".", ",", "?", "!", "'s", " n't", "x"]

    def decode(self, ids, skip_special_tokens=True):
        text = "".join(self.PIECES[i] for i in ids)
        for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                              (" 's", "'s")):
            text = text.replace(before, after)
        return text


def test_a_stop_string_a_later_token_of_the_same_step_cleans_away_still_stops_there():
    """[a, " ", "."] decodes to "a", "a ", "a.": one token at a time stops at the second
    token on the stop string "a ", so a step adding the last two at once must stop there too
    (it checked only the step's whole text, "a.", and went on)."""
    tok = CleanUpDecoder()
    assert [tok.decode([0, 2, 3][:k]) for k in (1, 2, 3)] == ["a", "a ", "a."]
    assert stop_length(tok, [0, 2, 3], ["a "], clean=1) == 2 == first_stop(tok, [0, 2, 3], ["a "])
    assert stop_length(tok, [0, 2, 3], [" "], clean=0) == 2


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_step_by_step_is_the_whole_prefix_answer_for_a_decoder_that_cleans_up_spaces(data):
    """As test_step_by_step_is_the_whole_prefix_answer, with the clean-up decoder: stop
    strings of spaces and punctuation that a later token can remove from the text."""
    tok = CleanUpDecoder()
    ids = data.draw(st.lists(st.integers(0, len(tok.PIECES) - 1), min_size=1, max_size=40), label="ids")
    stops = data.draw(st.lists(st.sampled_from([" ", "a ", " .", "b ,", " n", "x ", " '", "? a"]), min_size=1,
                               max_size=3), label="stops")
    assert stepped_stop(data, tok, ids, stops) == first_stop(tok, ids, stops)


def test_the_slices_cut_start_and_an_empty_run_before_the_new_token_are_handled():
    """Two edges of the slice a new token is checked on: its start may cut a character (the
    slice's text then begins with U+FFFD, which the whole prefix's does not hold), and the
    tokens before the new one may decode to nothing (a run of special tokens), so the slice
    must reach back past them to the text a stop string spans."""
    tok = tokenizer()
    ids = tok.encode("🦈" * 100 + " ab", add_special_tokens=False)
    assert stop_length(tok, ids, ["\ufffd"], clean=len(ids) - 1) is None
    ids = tok.encode("x", add_special_tokens=False) + [tok.all_special_ids[0]] * 100 + tok.encode(
        "y", add_special_tokens=False)
    assert stop_length(tok, ids, ["xy"], clean=len(ids) - 1) == len(ids) == first_stop(tok, ids, ["xy"])
