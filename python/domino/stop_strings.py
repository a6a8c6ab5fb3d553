"""Where a generation stops on a stop string: the fewest leading output tokens whose decoded
text contains one (decoding one token at a time would stop at that token).

A speculative round appends several tokens at once, and each of them must be checked as if
it had come alone: the text of a longer prefix need not extend a shorter one's (a decoder
that cleans up spaces, ``clean_up_tokenization_spaces``, turns "a ." into "a." when the
"." arrives, so a stop string " " held by one prefix is gone from the next one's text; an
unfinished UTF-8 character shows as U+FFFD until its last byte arrives), and a round that
checked only its whole new text would miss a stop that the one-token-at-a-time decoding
stops at.

Decoding the whole output at every token made a generation's stop checks quadratic in its
length (~1 ms a step at 4,000 tokens of SmolLM2's tokenizer, per sequence). A token only
has to look at the text it can have changed: an occurrence the earlier tokens' text did
not hold must end in its text, or within the few characters a decoder may rewrite at the
old text's end, so it starts at most one stop string's length before them. Decoding a
slice of the tokens gives that slice's text up to its first few characters (a character
cut in two and shown as U+FFFD, a leading space dropped), which is why the slice starts a
margin of characters earlier; a hit found there is confirmed on the text of the whole
prefix (so a stop string holding U+FFFD matches a character cut at the prefix's end, not
one the slice cut at its start).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["stop_length", "text_until_stop"]

# Characters at the start of a slice's text that may differ from the whole text's (a cut
# UTF-8 character's bytes, a dropped leading space), and at the end of the earlier text
# that a later token may rewrite; both a few at most: the margin is generous.
EDGE_CHARS = 8


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def _contains(text: str, stop: Sequence[str]) -> bool:
    return any(s and s in text for s in stop)


def _window_start(tokenizer, ids: Sequence[int], stop: Sequence[str], clean: int) -> int:
    """The first token of a slice of ``ids`` whose text reaches back at least the longest
    stop string plus 2 :data:`EDGE_CHARS` characters before token ``clean`` (0: the whole
    prefix)."""
    before = max(len(s) for s in stop) + 2 * EDGE_CHARS  # characters needed before the new token
    back = before  # tokens: most give a character or more; more are taken where they do not
    while True:
        start = max(0, clean - back)
        if start == 0 or len(_decode(tokenizer, ids[start:clean])) >= before:
            return start
        back *= 2


# Tokens a slice's start is reused for: a slice that reaches back far enough before one token
# reaches back far enough before the later ones too, and finding the start costs a decode;
# past this many tokens it moves up, so that a long step decodes slices of bounded length.
WINDOW_REUSE = 32


def stop_length(tokenizer, ids: Sequence[int], stop: Sequence[str], clean: int = 0) -> int | None:
    """The fewest leading tokens of ``ids`` whose text (``tokenizer.decode``, special tokens
    skipped) contains a string of ``stop``, or None. ``clean``: how many leading tokens are
    known to hold none (a previous step's whole output). Each later token is checked as
    decoding one at a time checks it, on the text it can have changed (a slice of the
    tokens from :func:`_window_start`), and a hit there is confirmed on the whole prefix's
    text."""
    if not any(stop) or len(ids) <= clean:
        return None
    start, since = 0, None
    for n in range(clean + 1, len(ids) + 1):
        if since is None or n - 1 - since > WINDOW_REUSE:
            since, start = n - 1, _window_start(tokenizer, ids, stop, n - 1)
        # A new occurrence starts past the slice's first EDGE_CHARS characters (the window
        # reaches back the longest stop string and twice that margin), where the slice's
        # text may differ from the whole text's (a character cut at its start as U+FFFD):
        # searched from there, a stop string holding U+FFFD does not match the cut and
        # decode the whole prefix to refute it at every token.
        if _contains(_decode(tokenizer, ids[start:n])[EDGE_CHARS if start else 0:], stop) and (
                start == 0 or _contains(_decode(tokenizer, ids[:n]), stop)):
            return n
    return None


def text_until_stop(tokenizer, ids: Sequence[int], stop: Sequence[str]) -> str:
    """The text of ``ids`` (special tokens skipped), cut before the earliest occurrence of
    any stop string (whatever their order in ``stop``: overlapping ones cut where the first
    of them starts)."""
    text = _decode(tokenizer, ids)
    return text[: min((text.index(s) for s in stop if s and s in text), default=len(text))]
