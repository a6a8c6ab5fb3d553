"""Regenerates the training prompts' responses with the target (greedy, run as the engine
deploys it: ``target_as_deployed``), as resumable append-only shards.

    python -m training.generate_data --out training/regenerated/smollm2_mix --target-tokens 5000000

Beside each shard go the target's hidden states at the drafter's feature layers (they fall
out of generation at no extra cost, so training never reruns the target) and, for every
response token, the target's top-``--top-k`` log-probabilities at that position (so the
drafter can be distilled on the target's distribution, not only its greedy token).
Shard i holds prompts [i*B, (i+1)*B) of the fixed prompt order (training/prompts.py); with
``--passes P`` the order is walked P times: shard p*S + j (S shards per pass) holds shard j's
prompts again, their responses *sampled* at ``--sample-temperature`` from the target's own
distribution (a seed per shard), new text on the target's distribution once the greedy
pass has used every prompt. A killed run resumes by skipping the shards already on disk: no shard is lost or written
twice (each is written to a temporary name and renamed). ``--worker I/N`` lets N processes
share the order (worker I takes the shards whose index is I mod N), e.g. one one-thread
process per core, so that a core can be lent to other work by pausing one worker
(``kill -STOP``) while the other keeps generating. Feature rebuilds are shared the same
way, and a worker done with its share goes on to any shard still lacking features; a lock
per shard (``rebuild_claim``) keeps two workers off the same one. Each line of a shard is
{"prompt_ids", "response_ids"}; the response is the target's greedy (pass 0) or sampled
(later passes) continuation, cut after its first EOS. The stored log-probabilities are the
target's own at temperature 1 in both cases.

The token shards are small and are what costs time (decoding token by token), so they are
committed to the repository (training/regenerated/); the feature files are large and
ignored by git. A shard whose feature file is missing gets it back from one teacher-forced
forward over its conversations (``features_from_ids``), minutes instead of hours; N
workers split those rebuilds evenly (``--target-tokens 0`` only rebuilds).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from domino.target import cache_kwarg, special_token_ids, target_features
from training.data import shard_index, shard_path
from training.prompts import training_prompts


def features_path(shard: Path) -> Path:
    """Tensors of a shard: "features" [tokens, n*H] bf16, the target's features of each
    conversation's prompt + response[:-1], concatenated, with "offsets" [convs + 1]; and
    "top_ids" [R, k] int32 / "top_logprobs" [R, k] float16, the target's top-k
    log-probabilities at each of the R response tokens, with "response_offsets" [convs + 1]."""
    return shard.with_suffix(".features.safetensors")


def features_to_rebuild(out: Path, worker: int, n_workers: int,
                        shard_range: tuple[int, int] | None = None) -> list[Path]:
    """The token shards in ``out`` without a feature file (a fresh clone: all of them), those
    in ``shard_range`` [start, end) when given, that worker I of N rebuilds: every N-th by
    rank in that sorted list, not by shard index, so each worker gets ~1/N of them however
    the missing ones are spread (by index, one worker got most of the work when only some
    shards lacked features)."""
    start, end = shard_range or (0, float("inf"))
    lacking = sorted(path for path in out.glob("shard_*.jsonl") if not features_path(path).exists()
                     and start <= shard_index(path) < end)
    return lacking[worker::n_workers]


@contextlib.contextmanager
def rebuild_claim(shard: Path):
    """Yields True when this process now holds ``shard``'s rebuild claim, False when another
    holds it. The claim is an exclusive ``flock`` on a file beside the shard: two workers
    never rebuild one shard at once, whenever each listed its work, and the kernel drops the
    lock of a killed worker, so nothing stale is left behind. The caller checks, holding it,
    that the features are still missing (another worker may have just written them)."""
    claim = shard.with_suffix(".features.claim")
    with open(claim, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            # removed while still locked: whoever opens it later locks a new file and finds
            # the features written
            claim.unlink(missing_ok=True)


def parse_worker(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N: this process takes the shards whose index is I mod N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--worker must look like I/N, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--worker I/N needs 0 <= I < N, got {text!r}")
    return i, n


def target_as_deployed(target_dir, device="cpu"):
    """The HF causal LM at ``target_dir``, loaded onto ``device`` as the engine loads and runs
    it (``domino.load``: ``domino.loading.load_target_model``, then the CPU kernels), in eval mode.

    On the CPU: :data:`domino.loading.DEFAULT_OPTIONS` (bf16, the batch-invariant
    small-batch linear and attention kernels, and with the linear the fused RMSNorm and
    SiLU-and-mul of :mod:`domino.fast_layers`; shards decoded before those existed hold
    the responses of the target without them), the configuration ``load_default``, the CLI
    and ``make run`` decode with. Every row of a batched forward is then computed bit for
    bit as that prompt decoded alone, so each regenerated response is exactly the deployed
    target's own greedy decoding of its prompt and its features are the bits the drafter
    reads when it runs (fp32 data differs: its responses part from the bf16 target's
    within 64 tokens in most prompts). It is also ~2.5x faster per thread than fp32 with
    PyTorch's matrix products (``benchmarks/bench_regenerate.py``). Elsewhere (``--device
    cuda``): fp32 with TF32 off, the target's own fp32 greedy decisions.

    Loaded in its dtype, not loaded in float32 and cast: ``Module.to(bfloat16)`` also
    rounds the rotary embedding's frequencies (a float32 buffer, which a model loaded in
    bf16 keeps), and the shards decoded before the seventy-second session (2026-12-07)
    came from that model: SmolLM2's logits differ from the deployed target's by up to
    ~1.3, and its greedy responses part from the deployed target's within a few dozen
    tokens."""
    from domino.loading import DEFAULT_OPTIONS, load_target_model, use_cpu_kernels

    if torch.device(device).type != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = False
        return load_target_model(target_dir, dtype=torch.float32, device=device)
    options = dict(DEFAULT_OPTIONS)
    model = load_target_model(target_dir, dtype=options.pop("dtype"), device=device)
    return use_cpu_kernels(model, **options)


def count_tokens(out: Path) -> tuple[int, int]:
    """(response tokens, conversations) over the shards in ``out``."""
    tokens = convs = 0
    for f in sorted(out.glob("shard_*.jsonl")):
        for line in f.open():
            tokens += len(json.loads(line)["response_ids"])
            convs += 1
    return tokens, convs


class TemperatureSampler:
    """Draws each row's next token from softmax(logits / T) with its own ``generator``.

    The draw inverts the row's cumulative distribution at one uniform number: the token is
    the first whose cumulative weight exceeds u x the row's total, which happens with
    probability exactly its weight over the total. ``torch.multinomial`` draws one
    exponential number per vocabulary entry instead (an exponential race): 84 ms a step for
    64 rows of SmolLM2's 49,152 entries on one Zen 4 core, a third of the step's forward.
    The cumulative sums run in float64, so rounding moves no more than ~1e-16 of
    probability between neighbouring tokens. (Shards up to 1337 of smollm2_mix were drawn
    with ``torch.multinomial`` inside HF ``generate``: the same distribution, other draws.)"""

    def __init__(self, temperature: float, generator: torch.Generator):
        self.temperature, self.generator = temperature, generator

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] (any float dtype) -> the drawn token ids [B] int64."""
        z = logits.float() / self.temperature
        cumulative = (z - z.amax(dim=-1, keepdim=True)).exp_().double().cumsum_(dim=-1)  # [B, V]
        u = torch.rand(logits.shape[0], 1, generator=self.generator, dtype=torch.float64, device=logits.device)
        drawn = torch.searchsorted(cumulative, u * cumulative[:, -1:], right=True)
        return drawn.clamp_(max=logits.shape[-1] - 1)[:, 0]


@dataclass
class Regenerated:
    """One batch of regenerated conversations and the tensors stored beside them."""

    records: list[dict]  # {"prompt_ids", "response_ids"}
    features: torch.Tensor  # [tokens, n*H] bf16
    offsets: list[int]  # [convs + 1] into features
    top_ids: torch.Tensor  # [R, k] int32
    top_logprobs: torch.Tensor  # [R, k] float16
    response_offsets: list[int]  # [convs + 1] into top_ids / top_logprobs
    layer_ids: list[int]


def regenerate(model, batch: list[list[int]], layer_ids: list[int], eos: set[int], pad: int,
               max_new_tokens: int, top_k: int = 32, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> Regenerated:
    """Greedy responses of ``model`` to the prompt ids in ``batch`` (or, with ``temperature``
    > 0, responses sampled from softmax(logits / temperature) with ``generator``, a
    torch.Generator on the model's device), the target features of every token fed to it
    and the target's top-``top_k`` log-probabilities (temperature 1) at every response token.

    The prompts but their last tokens are prefilled in small length-sorted groups
    (``_prefilled_cache``), then the batch decodes together from the prompts' last tokens
    (``_decode``): a left-padded batch prefill computes every row at the longest prompt's
    length, and with ShareGPT's prompts (20-256 tokens, median ~80) that was ~30 % of a
    shard's time, more than half of it padding."""
    if temperature > 0 and generator is None:
        raise ValueError("regenerate: temperature > 0 needs a generator (the draws must be reproducible)")
    T = max(len(p) for p in batch)
    cache, prefix_feats = _prefilled_cache(model, batch, T, max_new_tokens, layer_ids, pad)
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in batch], device=model.device)
    sampler = TemperatureSampler(temperature, generator) if temperature > 0 else None
    with torch.inference_mode():
        decoded = _decode(model, cache, ids, mask, max_new_tokens, eos, layer_ids, top_k, sampler)
    records, feats, top_ids, top_lp, offsets, r_offsets = [], [], [], [], [0], [0]
    for s_idx, (p, row) in enumerate(zip(batch, decoded.tokens.tolist())):
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        records.append({"prompt_ids": p, "response_ids": row[:cut]})
        # features of every token fed to the target: the prompt and response[:-1]
        feats.append(torch.cat([prefix_feats[s_idx], decoded.features[s_idx, :cut]]))
        offsets.append(offsets[-1] + feats[-1].shape[0])
        top_ids.append(decoded.top_ids[s_idx, :cut])
        top_lp.append(decoded.top_logprobs[s_idx, :cut])
        r_offsets.append(r_offsets[-1] + cut)
    return Regenerated(records, torch.cat(feats).contiguous(), offsets, torch.cat(top_ids).contiguous(),
                       torch.cat(top_lp).contiguous(), r_offsets, layer_ids)


@dataclass
class Decoded:
    """What ``_decode`` recorded per prompt and step s (step s feeds the token before
    response token s: the prompt's last token at s = 0). Past a prompt's first EOS, or a
    step its row no longer ran, entries are unspecified."""

    tokens: torch.Tensor  # [B, steps] int64: response token s
    features: torch.Tensor  # [B, steps, n*H] bf16: the target's features of the token fed at step s
    top_ids: torch.Tensor  # [B, steps, k] int32: the top-k tokens at response position s
    top_logprobs: torch.Tensor  # [B, steps, k] float16: their log-probabilities at temperature 1


def _decode(model, cache, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, eos: set[int],
            layer_ids: list[int], top_k: int, sampler: TemperatureSampler | None) -> Decoded:
    """Decodes the left-padded prompts ``ids`` [B, T] (``mask`` [B, T] marks real tokens)
    from ``cache``, a static cache holding each prompt but its last token (positions up to
    T - 2): one token a step for every unfinished row, greedy or drawn by ``sampler``, until
    every row has emitted an EOS or ``max_new_tokens`` steps have run.

    Rows that have finished leave the batch (the cache keeps the rows still decoding, in
    place of HF ``generate``'s padding of finished rows to the end): sampled responses end
    at very different lengths (a shard of 64 filled ~76 % of its 64 x 256 slots), and a
    row's bits do not depend on the batch (the kernels are batch-invariant). The cache is
    compacted when an eighth of its rows have finished: a copy of the whole cache (~0.7 GB
    for 64 rows of SmolLM2 at 477 positions) costs about half a step."""
    B, T = ids.shape
    n_feats = len(layer_ids) * model.config.get_text_config().hidden_size
    decoded = Decoded(torch.zeros(B, max_new_tokens, dtype=torch.long),
                      torch.zeros(B, max_new_tokens, n_feats, dtype=torch.bfloat16),
                      torch.zeros(B, max_new_tokens, top_k, dtype=torch.int32),
                      torch.zeros(B, max_new_tokens, top_k, dtype=torch.float16))
    eos_ids = torch.tensor(sorted(eos), device=ids.device)
    kv = torch.zeros(B, T - 1 + max_new_tokens, dtype=mask.dtype, device=ids.device)  # cache slots in use
    kv[:, :T] = mask
    rows = torch.arange(B)  # the prompt of each cache row
    position = mask.sum(dim=1) - 1  # [B] each prompt's last token's position (left padding has none)
    fed = ids[:, -1]  # [b] the token each row feeds this step
    finished = torch.zeros(B, dtype=torch.bool, device=ids.device)
    cache_kw = cache_kwarg(model.forward)
    for s in range(max_new_tokens):
        kv[:, T - 1 + s] = 1
        out = model(input_ids=fed[:, None], attention_mask=kv, position_ids=(position + s)[:, None],
                    use_cache=True, output_hidden_states=True, **{cache_kw: cache})
        logits = out.logits[:, -1].float()  # [b, V]
        decoded.features[rows, s] = target_features(out.hidden_states, layer_ids)[:, -1].to(torch.bfloat16).cpu()
        top = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
        decoded.top_ids[rows, s] = top.indices.to(torch.int32).cpu()
        decoded.top_logprobs[rows, s] = top.values.to(torch.float16).cpu()
        fed = sampler.draw(logits) if sampler is not None else logits.argmax(dim=-1)
        decoded.tokens[rows, s] = fed.cpu()
        finished |= torch.isin(fed, eos_ids)
        n_done = int(finished.sum())
        if n_done == len(rows):
            break
        if 8 * n_done >= len(rows):  # compact: keep the rows still decoding
            keep = (~finished).nonzero()[:, 0]
            cache.reorder_cache(keep)
            kv, position, fed, finished, rows = kv[keep], position[keep], fed[keep], finished[keep], rows[keep.cpu()]
    return decoded


def right_padded(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [b, T] right-padded with ``pad`` to the longest sequence, and the mask [b, T]
    of real tokens (for teacher-forced forwards: causal attention hides the padding from the
    real tokens, whose positions start at 0)."""
    T = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad] * (T - len(s)) for s in seqs], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in seqs], device=device)
    return ids, mask


def _prefilled_cache(model, batch: list[list[int]], T: int, max_new_tokens: int, layer_ids: list[int], pad: int,
                     chunk: int = 8):
    """A static KV cache of ``T + max_new_tokens`` positions holding every prompt but its
    last token, left-padded to ``T - 1`` (the padding is masked out, as in a padded batch
    prefill); and each prompt's features of those tokens ([len - 1, n*H] bf16, on the CPU).

    The prompts are prefilled ``chunk`` at a time in length order, right-padded
    (:func:`right_padded`), so the padding is small and a GPU gets a few sizeable forwards,
    not one per prompt."""
    from transformers import DynamicCache, StaticCache

    cache = StaticCache(config=model.config, max_cache_len=T + max_new_tokens)
    short = [layer.max_cache_len for layer in cache.layers if getattr(layer, "is_sliding", False)
             and layer.max_cache_len < T + max_new_tokens]
    if short:  # a window that would roll: the prompts are written in place below
        raise ValueError(f"the target's sliding window ({min(short)} tokens) is shorter than the longest prompt plus "
                         f"max_new_tokens ({T} + {max_new_tokens}): lower --max-prompt-tokens or --max-new-tokens")
    feats = [torch.empty(0, len(layer_ids) * model.config.hidden_size, dtype=torch.bfloat16) for _ in batch]
    order = sorted((i for i, p in enumerate(batch) if len(p) > 1), key=lambda i: len(batch[i]))
    if not order:
        return cache, feats
    with torch.inference_mode():
        for c0 in range(0, len(order), chunk):
            rows = order[c0:c0 + chunk]
            ids, mask = right_padded([batch[i][:-1] for i in rows], pad, model.device)
            own = DynamicCache()
            decoder = model.get_decoder()
            out = decoder(input_ids=ids, attention_mask=mask, use_cache=True, output_hidden_states=True,
                          **{cache_kwarg(decoder.forward): own})
            chunk_feats = target_features(out.hidden_states, layer_ids).to(torch.bfloat16).cpu()
            if not cache.is_initialized:
                k = own.layers[0].keys
                cache.early_initialization(len(batch), k.shape[1], k.shape[3], k.dtype, k.device)
            for r, i in enumerate(rows):
                m = len(batch[i]) - 1
                feats[i] = chunk_feats[r, :m]
                for layer, mine in zip(cache.layers, own.layers):  # written in place: no second copy
                    layer.keys[i, :, T - 1 - m:T - 1] = mine.keys[r, :, :m]
                    layer.values[i, :, T - 1 - m:T - 1] = mine.values[r, :, :m]
        for layer in cache.layers:
            layer.cumulative_length.fill_(T - 1)
            if hasattr(layer, "cumulative_length_int"):  # a sliding-window layer counts in a Python int too
                layer.cumulative_length_int = T - 1
    return cache, feats


def features_from_ids(model, records: list[dict], layer_ids: list[int], pad: int, top_k: int = 32,
                      batch_size: int = 8) -> Regenerated:
    """The tensors ``regenerate`` stores beside a shard, recomputed from its token ids by
    teacher-forced forwards of ``batch_size`` conversations (right-padded; causal attention
    makes the padding invisible to the real tokens). Equal to what generation recorded up
    to floating-point rounding.

    Only the response positions go through the LM head, one conversation at a time: the
    whole batch's logits in fp32 ([64, ~700, 49152] for a shard of SmolLM2) were 9 GB and
    most of a shard's time. The batches are formed in length order (the results are
    returned in ``records``' order): in file order a shard's padded batches computed ~1.5x
    its real tokens, in length order ~1.1x."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    seqs = [r["prompt_ids"] + r["response_ids"][:-1] for r in records]
    by_length = sorted(range(len(records)), key=lambda i: len(seqs[i]))
    feats, top_ids, top_lp = [None] * len(records), [None] * len(records), [None] * len(records)
    for b0 in range(0, len(records), batch_size):
        chunk = by_length[b0:b0 + batch_size]
        ids, mask = right_padded([seqs[i] for i in chunk], pad, model.device)
        with torch.inference_mode():
            out = body(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            feats_all = target_features(out.hidden_states, layer_ids).to(torch.bfloat16).cpu()
            for row, i in enumerate(chunk):
                feats[i] = feats_all[row, :len(seqs[i])]
                # the logits at position j predict token j + 1: response token t sits at len(prompt) + t
                rows = out.last_hidden_state[row, len(records[i]["prompt_ids"]) - 1:len(seqs[i])]
                top = torch.log_softmax(head(rows).float(), dim=-1).topk(top_k, dim=-1)
                top_ids[i] = top.indices.to(torch.int32).cpu()
                top_lp[i] = top.values.to(torch.float16).cpu()
    offsets = [0, *itertools.accumulate(len(s) for s in seqs)]
    r_offsets = [0, *itertools.accumulate(len(r["response_ids"]) for r in records)]
    return Regenerated(records, torch.cat(feats).contiguous(), offsets, torch.cat(top_ids).contiguous(),
                       torch.cat(top_lp).contiguous(), r_offsets, layer_ids)


def split_regenerated(data: Regenerated, sizes: list[int]) -> list[Regenerated]:
    """``data`` cut into consecutive parts of ``sizes`` conversations each (several shards
    regenerated in one batch, to keep a GPU busy, are written as the shards they are)."""
    if sum(sizes) != len(data.records):
        raise ValueError(f"sizes {sizes} do not add up to {len(data.records)} conversations")
    parts, c = [], 0
    for n in sizes:
        f0, f1 = data.offsets[c], data.offsets[c + n]
        r0, r1 = data.response_offsets[c], data.response_offsets[c + n]
        parts.append(Regenerated(data.records[c:c + n], data.features[f0:f1].contiguous(),
                                 [o - f0 for o in data.offsets[c:c + n + 1]], data.top_ids[r0:r1].contiguous(),
                                 data.top_logprobs[r0:r1].contiguous(),
                                 [o - r0 for o in data.response_offsets[c:c + n + 1]], data.layer_ids))
        c += n
    return parts


def tokenized_prompts(tok, max_prompt_tokens: int) -> list[list[int]]:
    """The fixed prompt order (training/prompts.py) as chat-templated token ids, those longer
    than ``max_prompt_tokens`` dropped."""
    prompts = []
    for text in training_prompts():
        ids = tok(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
    return prompts


def shard_batches(todo: list[int], n_shards: int, per_batch: int) -> list[list[int]]:
    """``todo`` (shard indices, ascending) cut into batches of at most ``per_batch`` shards,
    each within one pass of ``n_shards`` shards: the pass says how its responses are drawn."""
    batches: list[list[int]] = []
    for i in todo:
        if batches and len(batches[-1]) < per_batch and batches[-1][0] // n_shards == i // n_shards:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def read_shard_records(path: Path) -> list[dict]:
    """The records (one dict a conversation) of a shard's jsonl file."""
    return [json.loads(line) for line in path.open() if line.strip()]


def write_shard(path: Path, data: Regenerated) -> int:
    """Writes a shard atomically (tensors first, the jsonl last: its presence marks a
    complete shard). Returns the number of response tokens."""
    tmp = path.with_suffix(".features.tmp")
    save_file({"features": data.features, "offsets": torch.tensor(data.offsets),
               "top_ids": data.top_ids, "top_logprobs": data.top_logprobs,
               "response_offsets": torch.tensor(data.response_offsets)}, str(tmp),
              metadata={"layer_ids": json.dumps(data.layer_ids)})
    os.replace(tmp, features_path(path))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(json.dumps(r) for r in data.records) + "\n")
    os.replace(tmp, path)
    return sum(len(r["response_ids"]) for r in data.records)


MANIFEST = "dataset.json"


def weights_fingerprint(model, sample: int = 1 << 16) -> str:
    """A hash of the model's weights that tells one fine-tune from another: the first
    ``sample`` values of every parameter, as bf16 (so the same weights loaded in another
    dtype, e.g. float32 on a GPU, hash alike), in ``named_parameters`` order."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().flatten()[:sample].to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:20]


def dataset_manifest(model, tokenizer, layer_ids: list[int], args) -> dict:
    """What a dataset's shards depend on: the target (its architecture and vocabulary, and
    a fingerprint of its weights that tells one fine-tune from another), the prompts per
    shard, the lengths, the stored top-k and feature layers."""
    tc = model.config.get_text_config()
    target = {k: getattr(tc, k, None) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                               "intermediate_size", "num_attention_heads", "num_key_value_heads")}
    target["tokenizer_size"] = len(tokenizer)
    return {"target": target, "target_weights": weights_fingerprint(model), "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens, "top_k": args.top_k,
            "layer_ids": list(layer_ids), "sample_temperature": args.sample_temperature}


def check_manifest(out: Path, manifest: dict) -> None:
    """Writes ``out``/dataset.json on a new dataset (or one made before manifests); raises
    SystemExit naming the argument when the dataset was made with other settings (its
    shards would mix two targets, two prompt splits or two sampling temperatures). A key
    missing from an older dataset.json is not checked (its shards predate it) but recorded
    from this run, so the shards this run adds are checked from then on."""
    path = out / MANIFEST
    saved = json.loads(path.read_text()) if path.exists() else {}
    flags = {"target": "--target", "target_weights": "--target", "batch_size": "--batch-size",
             "max_new_tokens": "--max-new-tokens",
             "max_prompt_tokens": "--max-prompt-tokens", "top_k": "--top-k", "layer_ids": "the target's layers",
             "sample_temperature": "--sample-temperature"}
    for key, flag in flags.items():
        if key in saved and saved[key] != manifest[key]:
            raise SystemExit(f"{flag}: {out} was made with {key} {saved[key]}, this run has {manifest[key]} "
                             f"(give the same settings to extend it, or another --out)")
    if manifest.keys() - saved.keys():  # a new dataset, or keys an older one lacks
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**manifest, **saved}, indent=1) + "\n")
        os.replace(tmp, path)


def main() -> None:
    """Command line (module docstring; ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="the dataset directory (SmolLM2's: training/regenerated/smollm2_mix); its dataset.json "
                             "records what made it, and a run with other settings is refused")
    parser.add_argument("--target", type=Path, default=None, help="HF target dir (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=32, help="target log-probabilities stored per response token")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="where the target runs (cuda: fp32 with TF32 off)")
    parser.add_argument("--shards-per-batch", type=int, default=1,
                        help="shards regenerated together in one batch (a GPU wants hundreds of sequences)")
    parser.add_argument("--save-prompts", type=Path, default=None,
                        help="write the tokenized prompt order to this .json.gz and exit (for a machine "
                             "without the ShareGPT package; read it back with --prompts-file)")
    parser.add_argument("--prompts-file", type=Path, default=None, help="tokenized prompts from --save-prompts")
    parser.add_argument("--target-tokens", type=int, default=5_000_000, help="stop once this many response tokens exist")
    parser.add_argument("--passes", type=int, default=1,
                        help="walks over the prompt order: pass 0 greedy, later passes sampled (shard p*S + j holds "
                             "shard j's prompts in pass p)")
    parser.add_argument("--sample-temperature", type=float, default=0.7,
                        help="the temperature of the passes after the first (recorded in dataset.json)")
    parser.add_argument("--worker", type=parse_worker, default=(0, 1), metavar="I/N",
                        help="take only the shards whose index is I mod N (run N processes for I = 0..N-1)")
    parser.add_argument("--shard-range", type=int, nargs=2, default=None, metavar=("START", "END"),
                        help="decode, and rebuild the features of, only shards START <= i < END (e.g. one range "
                             "per machine)")
    args = parser.parse_args()
    if args.out is None and args.save_prompts is None:
        parser.error("--out is required (the dataset directory)")
    # checked before anything is loaded or written (dataset.json records them)
    for name in ("batch_size", "max_new_tokens", "max_prompt_tokens", "top_k", "shards_per_batch", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.target_tokens < 0:
        parser.error(f"--target-tokens must be >= 0, got {args.target_tokens}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.shard_range is not None and not 0 <= args.shard_range[0] < args.shard_range[1]:
        parser.error(f"--shard-range must be START END with 0 <= START < END, got {args.shard_range}")
    if not (math.isfinite(args.sample_temperature) and args.sample_temperature > 0):
        parser.error(f"--sample-temperature must be a finite number > 0, got {args.sample_temperature}")

    from transformers import AutoTokenizer

    from domino.config import default_drafter_config
    from domino.loading import smollm2_dir

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target_dir = args.target or smollm2_dir()
    tok = AutoTokenizer.from_pretrained(target_dir)
    if args.save_prompts:
        with gzip.open(args.save_prompts, "wt") as f:
            json.dump(tokenized_prompts(tok, args.max_prompt_tokens), f)
        print(f"wrote {args.save_prompts}")
        return
    model = target_as_deployed(target_dir, args.device)
    eos, pad = special_token_ids(model, tok)
    eos = set(eos)
    layer_ids = default_drafter_config(model.config).target_layer_ids
    if args.top_k > model.config.get_text_config().vocab_size:
        parser.error(f"--top-k must be at most the target's vocabulary ({model.config.get_text_config().vocab_size}), "
                     f"got {args.top_k}")

    if args.prompts_file:
        with gzip.open(args.prompts_file, "rt") as f:
            prompts = [p for p in json.load(f) if len(p) <= args.max_prompt_tokens]
    else:
        prompts = tokenized_prompts(tok, args.max_prompt_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    check_manifest(args.out, dataset_manifest(model, tok, layer_ids, args))
    n_shards = (len(prompts) + args.batch_size - 1) // args.batch_size
    tokens, convs = count_tokens(args.out)
    print(f"{len(prompts)} prompts in {n_shards} shards per pass, {args.passes} pass(es); on disk: {convs} "
          f"conversations, {tokens} response tokens")

    bar = tqdm(total=args.target_tokens, initial=min(tokens, args.target_tokens), unit="tok", desc="responses")
    worker, n_workers = args.worker
    start, end = args.shard_range or (0, n_shards * args.passes)
    todo = [i for i in range(worker, n_shards * args.passes, n_workers)
            if start <= i < end and not shard_path(args.out, i).exists()]
    rebuild = features_to_rebuild(args.out, worker, n_workers, args.shard_range)  # listed before decoding adds any
    lacking = features_to_rebuild(args.out, 0, 1, args.shard_range)
    groups = shard_batches(todo, n_shards, args.shards_per_batch)
    # Decoding first: it is what costs hours and what gets committed. Then the features of
    # committed token shards (a fresh clone has none), minutes per shard.
    for group in groups:
        if tokens >= args.target_tokens:
            break
        batches = [prompts[(i % n_shards) * args.batch_size:(i % n_shards + 1) * args.batch_size] for i in group]
        sampled = group[0] >= n_shards
        # seeded by the batch's first shard: a killed shard is redrawn as it was
        generator = torch.Generator(model.device).manual_seed(group[0]) if sampled else None
        data = regenerate(model, sum(batches, []), layer_ids, eos, pad, args.max_new_tokens, args.top_k,
                          temperature=args.sample_temperature if sampled else 0.0, generator=generator)
        for i, part in zip(group, split_regenerated(data, [len(b) for b in batches])):
            write_shard(shard_path(args.out, i), part)
        tokens, convs = count_tokens(args.out)  # the other workers' shards count too
        bar.update(min(tokens, args.target_tokens) - bar.n)
    bar.close()
    # This worker's share, then every other shard that lacked features: another worker's
    # leftovers (it started later and listed fewer, it was killed or is paused). The claim
    # keeps two workers off one shard.
    for path in itertools.chain(rebuild, lacking):
        with rebuild_claim(path) as mine:
            if mine and not features_path(path).exists():
                print(f"rebuilding the features of {path.name}")
                write_shard(path, features_from_ids(model, read_shard_records(path), layer_ids, pad, args.top_k))
    print(f"done: {convs} conversations, {tokens} response tokens in {args.out}")


if __name__ == "__main__":
    main()
