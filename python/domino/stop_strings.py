"""Where a generation stops on a stop string: the fewest leading output tokens whose decoded
text contains one (decoding one token at a time would stop at that token).

Decoding the whole output at every step made a generation's stop checks quadratic in its
length (~1 ms a step at 4,000 tokens of SmolLM2's tokenizer, per sequence). A step only
has to look at the text its new tokens can have changed: an occurrence the earlier tokens'
text did not hold must end in the new text, or within the few characters a decoder may
rewrite at the old text's end (an unfinished UTF-8 character shown as U+FFFD until its
last byte arrives), so it starts at most one stop string's length before them. Decoding a
slice of the tokens gives that slice's text up to the first few characters (a character
cut in two, a leading space dropped), which is why the slice starts a margin of characters
earlier. A hit found there is confirmed, and placed, on the text of whole prefixes. A
stop string holding U+FFFD (the cut character itself) breaks that monotonicity and is
matched prefix by prefix instead.
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


def _may_hit_after(tokenizer, ids: Sequence[int], stop: Sequence[str], clean: int) -> bool:
    """False only where no stop string can be in the text of ``ids`` when none is in that
    of its first ``clean`` tokens: the text of a slice that reaches back at least the
    longest stop string plus :data:`EDGE_CHARS` characters before the new tokens holds none."""
    before = max(len(s) for s in stop) + 2 * EDGE_CHARS  # characters needed before the new tokens
    back = before  # tokens: most give a character or more; more are taken where they do not
    while True:
        start = max(0, clean - back)
        if start == 0 or len(_decode(tokenizer, ids[start:clean])) >= before:
            return _contains(_decode(tokenizer, ids[start:]), stop)
        back *= 2


# What a decoder shows for a UTF-8 character cut in two at the end of a text: a prefix's
# text ends with it where a longer prefix's shows the whole character.
REPLACEMENT = "\ufffd"


def _first_prefix_hit(tokenizer, ids: Sequence[int], stop: Sequence[str], clean: int) -> int | None:
    """Prefix by prefix from ``clean + 1``: for a stop string holding U+FFFD, which matches a
    character still cut in two at the end of one prefix and gone from the next one's text,
    so the texts of longer prefixes do not extend shorter ones' and neither the whole
    text's check nor bisection can place the hit (one decode of a whole prefix per token:
    the price of such a stop string)."""
    for n in range(clean + 1, len(ids) + 1):
        if _contains(_decode(tokenizer, ids[:n]), stop):
            return n
    return None


def stop_length(tokenizer, ids: Sequence[int], stop: Sequence[str], clean: int = 0) -> int | None:
    """The fewest leading tokens of ``ids`` whose text (``tokenizer.decode``, special tokens
    skipped) contains a string of ``stop``, or None. ``clean``: how many leading tokens are
    known to hold none (a previous step's whole output): only the text the later ones can
    have changed is decoded, unless a hit is found there."""
    if not any(stop) or len(ids) <= clean:
        return None
    if any(REPLACEMENT in s for s in stop):
        return _first_prefix_hit(tokenizer, ids, stop, clean)
    if clean and not _may_hit_after(tokenizer, ids, stop, clean):
        return None
    if not _contains(_decode(tokenizer, ids), stop):
        return None
    lo, hi = clean + 1, len(ids)  # a longer prefix's text extends a shorter one's: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if _contains(_decode(tokenizer, ids[:mid]), stop):
            hi = mid
        else:
            lo = mid + 1
    return lo


def text_until_stop(tokenizer, ids: Sequence[int], stop: Sequence[str]) -> str:
    """The text of ``ids`` (special tokens skipped), cut before the earliest occurrence of
    any stop string (whatever their order in ``stop``: overlapping ones cut where the first
    of them starts)."""
    text = _decode(tokenizer, ids)
    return text[: min((text.index(s) for s in stop if s and s in text), default=len(text))]
