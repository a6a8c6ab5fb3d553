"""How much of a batch's work leaves with its finished requests: the rows the target's
forwards carry when greedy batches of held-out chat prompts decode with the loaded default,
against the rows they would carry if every request rode along until the batch's last
finished (the same forwards: a greedy request's rounds do not depend on its neighbours),
for ``generate`` (the default rounds) and ``generate_plain``.

    python benchmarks/finished_requests_rows.py [--num-prompts 16] [--batch-size 4] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse

import domino
from eval_acceptance import chat_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    gen = domino.load_default()
    prompts, b = chat_prompts(args.num_prompts), args.batch_size
    gen.generate(prompts[:b], max_new_tokens=4)  # the budget's costs at this batch size, measured once (not counted)
    rows: list[int] = []
    gen.target.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    for method in ("generate", "generate_plain"):
        carried = riding = 0
        for i in range(0, len(prompts), b):
            rows.clear()
            getattr(gen, method)(prompts[i:i + b], max_new_tokens=args.max_new_tokens)
            carried, riding = carried + sum(rows), riding + len(rows) * len(prompts[i:i + b])
        print(f"{method}: batches of {b} held-out chat prompts x {args.max_new_tokens} tokens: {carried} rows "
              f"forwarded, against {riding} riding along ({carried / riding:.2f})", flush=True)


if __name__ == "__main__":
    main()
