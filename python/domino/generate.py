"""Lossless speculative generation with a Domino drafter on a HF transformers target.

One round, for every sequence of the batch at once:
  1. the drafter drafts n tokens after the anchor (the last verified token) from its cached
     context (backbone forward + Domino head rollout); by default n, and the k <= n of them
     verified, are chosen each round to maximise expected tokens per millisecond from
     measured costs and the drafter's calibrated confidence (:mod:`domino.budget`);
  2. the target runs once over [anchor, k drafts] with its KV cache;
  3. ``domino_ops.verify_greedy`` (T = 0) or ``verify_sampling`` (T > 0, rejection
     sampling against the drafter's corrected distribution) keeps the longest valid
     prefix plus one target token;
  4. the target's KV cache is cropped to the longest kept prefix in the batch; slots a
     shorter sequence did not keep stay as masked holes, so sequences advance independently;
     the kept tokens' target features become new draft context.
The only host-device synchronisation per round is reading the accepted lengths.

With ``tree=TreeShape(topk, depth, num_draft_tokens)`` step 1 drafts a tree instead (the
Domino head carries a GRU state per branch; at T = 0 a prompt-lookup chain, :mod:`domino.lookup`,
and a chain retrieved from the datastore of the target's outputs, :mod:`domino.datastore`,
are grafted onto it), step 2 runs the target once over its nodes
with a tree attention mask, step 3 walks the tree (``verify_tree_greedy`` /
``verify_tree_sampling``), and step 4 first moves the accepted path's KV entries to the
front of the round (:mod:`domino.tree`); the rest is the chain's commit step. By default
(``tree="auto"``) greedy requests run :data:`domino.tree.DEFAULT_TREE` rounds or adaptive
chain rounds, whichever has measured faster (:mod:`domino.round_kind`), and sampled ones
chains (see :meth:`DominoGenerator.generate`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

import domino_ops
from domino import budget, prompts
from domino.budget import DepthAcceptance, RoundCosts
from domino.datastore import DEFAULT_DATASTORE_TOKENS, TokenDatastore
from domino.fast_forward import model_fixed
from domino.kv_cache import GrowingCache
from domino.lookup import DEFAULT_LOOKUP_TOKENS, LONG_MATCH, NgramIndex
from domino.model import DominoDraftModel, Draft, DraftContextCache
from domino.round_kind import ROUND_KINDS, RoundKindChooser
from domino.sampling_params import RowSampling, SamplingParams
from domino.stop_strings import stop_length, text_until_stop
from domino.target import (bare_generation_config, cache_kwarg, longrope_switch, sliding_window, special_token_ids,
                           target_features)
from domino.tree import (DEFAULT_TREE, TreeLinks, TreeShape, check_tree_attention, compact_tree_cache,
                         depths_tried, graft_chains, graft_sizes, path_acceptance, top_chain_counts, tree_attention_mask,
                         tree_attention_supported, tree_links, verify_tree)
from domino_ops import _checks
from domino_ops.tree_draft import DraftTree, select_draft_nodes


@dataclass
class GenerationResult:
    """Output of one prompt (or of each prompt, as lists, for a batch)."""

    text: str | list[str]
    token_ids: list[int] | list[list[int]]
    # tokens each verification round advanced the sequence (accepted drafts + the target's
    # own), the last round's counted in full even where max_new_tokens, EOS or a stop string
    # cut the output inside it: what the round achieved, so len(token_ids) can be less than
    # 1 + sum (the first token comes from the prefill). A greedy chain round drafts no more
    # than max_new_tokens can take (the longest-needing sequence of a batch), so there its
    # count stops at the limit.
    acceptance_lengths: list[int] | list[list[int]]
    tokens_per_second: float
    elapsed_s: float = 0.0
    # tokens the target verified per round (the anchor and the drafts or tree nodes), per
    # round of acceptance_lengths: the cost side of the acceptance
    verified_lengths: list[int] | list[list[int]] | None = None

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens advanced per verification round (``acceptance_lengths``), averaged over
        every round of every sequence."""
        lens = self.acceptance_lengths
        flat = [x for seq in lens for x in seq] if lens and isinstance(lens[0], list) else list(lens)
        return sum(flat) / max(len(flat), 1)


# the logits' dtypes the verify and sampling ops take (others are converted to float32)
_OP_LOGITS_DTYPES = (torch.bfloat16, torch.float32)
# the dtypes the head's kernels take a drafter's weights in (domino.loading.drafter_dtype)
DRAFTER_DTYPES = (torch.float32, torch.bfloat16)


def _sampler_rows(logits: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """Logit rows [b, V] as ``domino_ops.sample`` gets them: greedy, bf16 or float32 as
    they are (its argmax reads either: the same token, without a float32 copy); sampling,
    or a float16 target's, float32 (the sampler takes float32 or bf16, and a draw's bits
    follow the input dtype: float32, as they always were)."""
    if not sampling.any_sampled and logits.dtype in _OP_LOGITS_DTYPES:
        return logits
    return logits.float()


@dataclass
class _Decoding:
    """What carries over from round to round, for a batch of b sequences still decoding
    (a sequence that finishes leaves the batch: :meth:`select_rows`)."""

    cache: GrowingCache  # the target's KV cache, with holes
    cache_mask: torch.Tensor  # [b, T] bool: which cache slots are real tokens
    dcache: DraftContextCache  # the drafter's context, up to the last round that drafted
    anchor: torch.Tensor  # [b] int64: the last verified token (not in the caches yet)
    anchor_pos: torch.Tensor  # [b] int64: its position
    # (features [b, m, n*H], positions [b, m], valid [b, m]) of each round committed since,
    # not yet in dcache: DominoGenerator._drafter_context adds them before the next draft
    pending_context: list = field(default_factory=list)
    # no verified token's position reaches this (the context window, or a longrope
    # target's switch: DominoGenerator._position_limit); None: no bound
    position_limit: int | None = None
    # the request (its index in the call's batch) each of the b rows decodes
    rows: list[int] = field(default_factory=list)

    def select_rows(self, keep: list[int]) -> None:
        """Keeps rows ``keep`` (indices into the b rows, in order) and drops the others:
        the sequences that have finished leave the batch, so no later forward, draft or
        cache copy spends anything on them."""
        index = torch.tensor(keep, dtype=torch.int64, device=self.anchor.device)
        self.cache.batch_select_indices(index)
        self.cache_mask = self.cache_mask.index_select(0, index)
        self.dcache.select_rows(index)
        self.anchor, self.anchor_pos = self.anchor.index_select(0, index), self.anchor_pos.index_select(0, index)
        self.pending_context = [tuple(t.index_select(0, index) for t in part) for part in self.pending_context]
        self.rows = [self.rows[i] for i in keep]


# The prior acceptance of a grafted chain's new tokens, per kind of graft and position
# (given the ones before were accepted), before a call has seen its own (DepthAcceptance's 4
# pseudo-rounds): a chain's first new token is the gamble, a copy that started right goes on
# right, and a prompt-lookup chain after a long match (domino.lookup.LONG_MATCH tokens or
# more) is a far better bet than after a 2- or 3-token one. `python
# benchmarks/graft_acceptance.py` (12 HumanEval and 12 held-out chat prompts x 128 tokens,
# full-length grafts; results/graft_acceptance_zen3_session46.txt), HumanEval / chat: after
# a long match the first new token 0.67 / 0.85, then 0.80-1.00; after a short one 0.14 /
# 0.35, then 0.50-1.00 (~0.75 where counts are many); a datastore chain 0.21 / 0.15, then
# 0.50-0.83.
GRAFT_PRIOR = {"lookup-long": [0.75] + [0.95] * 9, "lookup-short": [0.25] + [0.75] * 9,
               "datastore": [0.2] + [0.6] * 5}


def lookup_graft_kind(match: int) -> str:
    """The kind of graft (a :data:`GRAFT_PRIOR` key) of a prompt-lookup chain that follows a
    suffix match of ``match`` tokens."""
    return "lookup-long" if match >= LONG_MATCH else "lookup-short"


def new_graft_acceptance(lookup_tokens: int, datastore_tokens: int) -> dict[str, DepthAcceptance]:
    """A call's acceptance counts of grafted chains' new tokens, per kind of graft (the keys
    of :data:`GRAFT_PRIOR`), for chains of at most ``lookup_tokens`` / ``datastore_tokens``."""
    most = {"lookup-long": lookup_tokens, "lookup-short": lookup_tokens, "datastore": datastore_tokens}
    return {kind: DepthAcceptance(max(most[kind], 1), prior) for kind, prior in GRAFT_PRIOR.items()}


@dataclass
class _TreePlan:
    """The adaptive budget's plan of a greedy tree round: the tokens it expects the round to
    advance (summed over the live sequences; grafts add theirs) and the tree's drafting
    milliseconds."""

    tokens: float
    draft_ms: float


def check_drafter_fits(target, drafter: DominoDraftModel) -> None:
    """Raises ValueError when ``drafter`` was not built for ``target`` (a different hidden
    size, vocabulary or number of layers than its config names) or sits on another device,
    instead of a shape error deep inside the first forward."""
    if not isinstance(drafter, DominoDraftModel):
        raise TypeError(f"drafter must be a domino.DominoDraftModel, got {type(drafter).__name__}")
    tc, dc = target.config.get_text_config(), drafter.config
    for what, want, got in (("hidden_size", tc.hidden_size, dc.hidden_size),
                            ("vocab_size", tc.vocab_size, dc.vocab_size),
                            ("number of target layers", tc.num_hidden_layers, dc.num_target_layers)):
        if want != got:
            raise ValueError(f"drafter: built for a target with {what} {got}, but this target has {want} "
                             f"(a drafter is trained for one target)")
    if max(dc.target_layer_ids) >= tc.num_hidden_layers:
        raise ValueError(f"drafter: reads target layers {list(dc.target_layer_ids)}, but this target has "
                         f"{tc.num_hidden_layers}")
    t_dev, d_dev = next(target.parameters()).device, next(drafter.parameters()).device
    if t_dev != d_dev:
        raise ValueError(f"drafter: is on {d_dev} but the target is on {t_dev}")
    d_dtype = next(drafter.parameters()).dtype
    if d_dtype not in DRAFTER_DTYPES:
        raise ValueError(f"drafter: its weights are {str(d_dtype).replace('torch.', '')}, but the head's kernels "
                         "take float32 or bfloat16: convert it (a float16 target may keep a float32 drafter)")


class DominoGenerator:
    """Speculative generation: ``gen.generate(prompt, ...)``; ``gen.target``/``gen.tokenizer``
    are the HF objects."""

    def __init__(self, target, drafter: DominoDraftModel, tokenizer, datastore: TokenDatastore | None = None):
        """``datastore``: the target's own outputs to retrieve chains from in greedy tree
        rounds (:mod:`domino.datastore`), or None."""
        check_drafter_fits(target, drafter)
        if datastore is not None and not isinstance(datastore, TokenDatastore):
            raise TypeError(f"datastore must be a domino.datastore.TokenDatastore or None, got {type(datastore).__name__}")
        if datastore is not None:
            vocab = target.get_input_embeddings().num_embeddings
            if int(datastore.tokens.max()) >= vocab:
                raise ValueError(f"datastore: holds token id {int(datastore.tokens.max())}, but the target's "
                                 f"vocabulary has {vocab} (a datastore holds one target's outputs)")
        self.datastore = datastore
        self.target = target.eval()
        self.drafter = drafter.eval().bind_target(target)
        self.tokenizer = tokenizer
        self.eos_ids, self.pad_id = special_token_ids(target, tokenizer)
        self._costs: dict[int, RoundCosts] = {}
        # per batch size: which round kind "auto" plays (kept across calls: it measures
        # this machine, and greedy output does not depend on it)
        self._round_kinds: dict[int, RoundKindChooser] = {}
        self._cache_kw = cache_kwarg(self.target.forward)  # "cache" or "past_key_values"

    @property
    def device(self) -> torch.device:
        """The device the target's weights are on."""
        return next(self.target.parameters()).device

    # ---- prompts ----------------------------------------------------------------------

    def encode(self, prompt: prompts.Prompt) -> list[int]:
        """Token ids of one prompt (see :mod:`domino.prompts`)."""
        return prompts.encode(self.tokenizer, prompt)

    def _encode_request(self, prompt, max_new_tokens: int, stop=()) -> tuple[list[list[int]], bool, list[str]]:
        """Validates a request up front: (token ids per prompt, whether it was a batch, stop strings)."""
        prompts.check_max_new_tokens(max_new_tokens)
        stop = prompts.check_stop(stop)
        config = self.target.config.get_text_config()
        seqs, batch = prompts.encode_all(self.tokenizer, prompt, config.vocab_size)
        prompts.check_context(seqs, max_new_tokens, getattr(config, "max_position_embeddings", None), batch)
        prompts.check_rope_switch(seqs, max_new_tokens, longrope_switch(config), batch)
        return seqs, batch, stop

    def _position_limit(self, seqs: list[list[int]]) -> int | None:
        """The position no token a call feeds the target may reach: a longrope target's
        switch while every prompt is below it (``prompts.check_rope_switch`` keeps a call
        on one side), else the context window (None: the config names none). Past the
        window a "dynamic" rotary rescales a whole forward, past the switch a longrope one
        re-rotates it: a verified block there would not decode as one token at a time does."""
        config = self.target.config.get_text_config()
        switch = longrope_switch(config)
        if switch is not None and max(len(s) for s in seqs) <= switch:
            return switch
        return getattr(config, "max_position_embeddings", None)

    @staticmethod
    def _position_room(seqs, out_ids, rows: list[int], limit: int | None) -> int | None:
        """The most drafts a round may verify with no verified position of the sequences
        ``rows`` (those still decoding) reaching ``limit`` (None: no limit). A sequence's
        anchor sits at its prompt length + its tokens so far - 1, and ``check_context``
        leaves it at least one position of room, so the room is >= 1."""
        return None if limit is None else limit - 1 - max(len(seqs[s]) + len(out_ids[s]) - 1 for s in rows)

    @staticmethod
    def _chain_room(out_ids, rows: list[int], max_new_tokens: int, sampling: RowSampling,
                    position_room: int | None) -> int | None:
        """The most drafts a chain round may verify (None: no bound): within
        ``position_room`` and, when every request is greedy, no more than the sequence of
        ``rows`` (those still decoding) that needs the most tokens can still keep (a round
        keeps at most its drafts + 1; the last round had verified a whole block). A sampled
        request's draws follow the rounds' sizes, so sampled rounds keep theirs: a seeded
        request then repeats its tokens alone and in a batch (with a fixed ``num_drafts``)
        except at the end of the context window."""
        if sampling.any_sampled:
            return position_room
        need = max(max_new_tokens - len(out_ids[s]) for s in rows) - 1
        return need if position_room is None else min(need, position_room)

    def _left_pad(self, seqs: Sequence[list[int]]):
        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), self.pad_id, dtype=torch.int64)
        mask = torch.zeros(len(seqs), T, dtype=torch.bool)
        for i, s in enumerate(seqs):
            ids[i, T - len(s):] = torch.tensor(s, dtype=torch.int64)
            mask[i, T - len(s):] = True
        return ids.to(self.device), mask.to(self.device)

    def round_costs(self, batch_size: int) -> RoundCosts:
        """Measured milliseconds of a round's drafting and verification at this batch size
        (:func:`domino.budget.round_costs`: measured once per model, dtype and machine,
        cached on disk)."""
        if batch_size not in self._costs:
            self._costs[batch_size] = budget.round_costs(self, batch_size)
        return self._costs[batch_size]

    # ---- the target -------------------------------------------------------------------

    def _target_forward(self, ids, mask, positions, cache, last_logits_only: bool = False):
        """Logits [b, T, V] (only the last position's, [b, 1, V], with ``last_logits_only``:
        the prefill needs no others, and a prompt's LM-head rows would cost more than its
        layers) in the target's dtype where it is bf16 or float32, else float32, and the
        drafter's context features [b, T, n*H]. Greedy verification reads bf16 logits as
        they are (the same argmax; their float32 copy cost ~0.2 ms a round); whatever
        samples from them converts them to float32 first, as it always did.
        ``mask`` is [b, past + T] bool (real tokens; causal within ids) or a 4D additive
        float mask [b, 1, T, past + T], passed to the model as it is."""
        mask = mask.long() if mask.dtype == torch.bool else mask
        # The causal LM's own forward, not its body and lm_head: some targets transform
        # the logits after lm_head (Gemma 2's soft-capping, Cohere's and Granite's scales),
        # and sampling must verify against the distribution the target decodes with.
        out = self.target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          output_hidden_states=True, logits_to_keep=1 if last_logits_only else 0,
                          **{self._cache_kw: cache})
        features = target_features(out.hidden_states, self.drafter.config.target_layer_ids)
        logits = out.logits
        return (logits if logits.dtype in _OP_LOGITS_DTYPES else logits.float()), features

    # ---- generation -------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompt: prompts.Prompts, *, max_new_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_head: bool = True, num_drafts: int | None = None, stop: Sequence[str] = (),
                 generator: torch.Generator | None = None,
                 stream: Callable[[int, list[int]], None] | None = None,
                 tree: TreeShape | None | str = "auto",
                 lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
                 datastore_tokens: int = DEFAULT_DATASTORE_TOKENS) -> GenerationResult:
        """Generates up to ``max_new_tokens`` per prompt, stopping at EOS or a stop string.

        ``prompt`` is one prompt (string, chat message list, token ids) or a list of them
        (a batch). Sampling: ``temperature`` / ``top_k`` / ``top_p`` for every prompt, or
        ``sampling``, one :class:`SamplingParams` for all or one per prompt (each may carry
        its own seed); ``generator`` drives the draws of requests without a seed.
        ``stream(i, new_ids)`` is called with each sequence's newly accepted tokens after
        every round. ``num_drafts``: tokens drafted and verified per round (fewer in a
        greedy call's last rounds, where the output can take no more); None (the
        default, fastest) chooses them each round from the measured costs of this machine
        (measured on the first call for a batch size, then cached on disk; the rounds
        after requests have finished read those of the smallest measured batch size at or
        above the rows left, :func:`domino.budget.cost_batch_size`) and the drafter's
        confidence; it chooses one size for the whole batch, so a seeded request
        repeats its tokens in another batch only with a fixed ``num_drafts`` (and away
        from the end of the context window, where rounds draft less). The output
        is exactly the target's own decoding: greedy at temperature 0, distributed as the
        target's filtered distribution otherwise, per request.

        ``tree``: a :class:`domino.TreeShape` drafts and verifies a tree of tokens per round
        instead of a chain; None: the chain of ``num_drafts`` drafts. A batch with a sampled
        request drafts sampled trees (every candidate verified, ``num_draft_tokens`` None),
        each request with its own temperature/top_k/top_p and seed; its greedy requests
        take the best tokens and are verified greedily. "auto"
        (the default, the fastest lossless choice measured): when every request is greedy,
        ``num_drafts`` is None and the target's attention takes a tree mask, each round is
        a :data:`domino.tree.DEFAULT_TREE` round or an adaptive chain round, whichever has
        kept more tokens per millisecond on this generator so far
        (:mod:`domino.round_kind`: on a CPU whose verification forward is compute-bound the
        chain can win); the chain otherwise (a sampled tree verifies every draw, so it gets
        no budget).

        ``lookup_tokens``: greedy tree rounds also verify up to this many tokens copied from
        earlier in the prompt or output (prompt lookup, :mod:`domino.lookup`), grafted onto
        the draft tree (with the adaptive budget, the new ones that pay for their
        verification, :func:`domino.budget.best_graft_length`); 0: the drafter's tree alone.
        Sampled requests and chains never use it.
        ``datastore_tokens``: likewise, up to this many tokens retrieved from the generator's
        datastore of the target's own outputs (:mod:`domino.datastore`; nothing without one).
        """
        seqs, batch, stop = self._encode_request(prompt, max_new_tokens, stop)
        params = self._sampling_params(len(seqs), temperature, top_k, top_p, sampling)
        use_head = _checks.flag("use_head", use_head)
        self._check_stream_and_generator(stream, generator)
        window = sliding_window(self.target.config)
        if window is not None and len(seqs) > 1:
            raise ValueError(f"prompt: this target attends to a sliding window ({window} positions), which HF "
                             "counts in cache slots; a batch leaves masked slots in the shared cache that would "
                             "shift it, so give one prompt per call")
        auto = isinstance(tree, str) and tree == "auto"
        if auto:
            tree = self._default_tree(params, num_drafts)
        if tree is not None:
            if not isinstance(tree, TreeShape):
                raise ValueError(f"tree must be a domino.TreeShape, None or 'auto', got {tree!r}")
            tree.check(self.drafter.config.num_drafts, params)
            if num_drafts is not None:
                raise ValueError("num_drafts is a chain's size: give it with tree=None (a tree's size is "
                                 "TreeShape.num_draft_tokens)")
            check_tree_attention(self.target)
            vocab = self._draft_vocab_size()
            if tree.topk > vocab:
                raise ValueError(f"tree: topk ({tree.topk}) must be at most the drafter's vocabulary ({vocab} tokens)")
        rows = RowSampling.from_params(params, self.device, generator)
        for name, value in (("lookup_tokens", lookup_tokens), ("datastore_tokens", datastore_tokens)):
            prompts.check_int(name, value, lo=0)
        # A graft adds no node deeper than the drafter's num_drafts (graft_chains), so longer
        # chains are never verified: their tokens cut there, the rounds are the same, and a
        # huge value costs nothing (each kind's acceptance table has a slot per token).
        n_max = self.drafter.config.num_drafts
        lookup_tokens, datastore_tokens = int(min(lookup_tokens, n_max)), int(min(datastore_tokens, n_max))
        if tree is None or rows.any_sampled:
            lookup_tokens = datastore_tokens = 0
        if self.datastore is None:
            datastore_tokens = 0
        if num_drafts is not None:
            prompts.check_int("num_drafts", num_drafts, lo=0, hi=n_max, none="None or ")
            num_drafts = int(num_drafts)
        # the budget's costs, for the call's batch size and the smaller ones its rounds may
        # carry once requests have finished, measured (or read from disk) before the clock
        # starts (a sampled tree verifies every draw: no budget)
        adaptive = num_drafts is None if tree is None else tree.num_draft_tokens is None and not rows.any_sampled
        if adaptive:
            for size in budget.cost_batch_sizes(len(seqs)):
                self.round_costs(size)
        # "auto" with a tree (greedy, adaptive): each round a tree or a chain, by measured speed
        auto = auto and tree is not None and adaptive
        t0 = time.perf_counter()
        with model_fixed(self.target), self.drafter.weights_fixed():
            token_ids, accept, verified = self._speculative(seqs, max_new_tokens, rows, use_head, stop, stream, tree,
                                                            adaptive, num_drafts, lookup_tokens, datastore_tokens, auto)
        return self._result(token_ids, accept, verified, time.perf_counter() - t0, batch, stop)

    @staticmethod
    def _check_stream_and_generator(stream, generator) -> None:
        if stream is not None and not callable(stream):
            raise TypeError(f"stream must be a callable(i, new_ids) or None, got {type(stream).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__} "
                            "(per-request randomness: sampling=[SamplingParams(..., seed=...), ...])")

    def _result(self, token_ids: list[list[int]], accept: list[list[int]], verified: list[list[int]],
                elapsed: float, batch: bool, stop: Sequence[str]) -> GenerationResult:
        """A call's GenerationResult: per-sequence lists for a batch, else the one sequence's."""
        texts = [text_until_stop(self.tokenizer, t, stop) for t in token_ids]
        total = sum(len(t) for t in token_ids)
        res = GenerationResult(texts, token_ids, accept, total / elapsed, elapsed, verified)
        if not batch:
            res.text, res.token_ids, res.acceptance_lengths = texts[0], token_ids[0], accept[0]
            res.verified_lengths = verified[0]
        return res

    def _default_tree(self, params: list[SamplingParams], num_drafts: int | None) -> TreeShape | None:
        """What ``tree="auto"`` drafts for these requests: DEFAULT_TREE or None (the chain)."""
        greedy = not any(domino_ops.sampling.may_sample(p.temperature) for p in params)
        fits = (DEFAULT_TREE.depth <= self.drafter.config.num_drafts and DEFAULT_TREE.topk <= self._draft_vocab_size()
                and tree_attention_supported(self.target))
        return DEFAULT_TREE if greedy and num_drafts is None and fits else None

    def _draft_vocab_size(self) -> int:
        """The tokens the drafter can draft: its draft vocabulary's, else the target's."""
        d_vocab = self.drafter.draft_vocab
        return self.drafter.config.vocab_size if d_vocab is None else d_vocab.numel()

    @staticmethod
    def _sampling_params(b: int, temperature, top_k, top_p, sampling) -> list[SamplingParams]:
        """One SamplingParams per prompt, from the loose arguments or ``sampling``."""
        if sampling is None:
            return [SamplingParams(temperature, top_k, top_p)] * b
        if (temperature, top_k, top_p) != (0.0, 0, 1.0):
            raise ValueError("give either sampling= or temperature/top_k/top_p, not both")
        if isinstance(sampling, SamplingParams):
            return [sampling] * b
        if isinstance(sampling, (str, bytes, dict)) or not hasattr(sampling, "__iter__"):
            raise TypeError(f"sampling must be a SamplingParams or a list of {b} (one per prompt), got "
                            f"{type(sampling).__name__}")
        params = list(sampling)
        if len(params) != b or not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError(f"sampling must be a SamplingParams or a list of {b} (one per prompt), got {sampling!r}")
        return params

    def _finished(self, ids: list[int], max_new_tokens: int, stop: list[str], clean: int = 0
                  ) -> tuple[bool, list[int]]:
        """Whether a sequence is done, and its tokens cut where decoding one token at a time
        would have stopped: at the token limit, the first EOS within it, or the token that
        completes a stop string, whichever comes first (a round may accept tokens past any
        of them: those are dropped). ``clean``: how many leading tokens were already found
        to complete none (the sequence's tokens before this step's)."""
        done = len(ids) >= max_new_tokens
        ids = ids[:max_new_tokens]
        for j, t in enumerate(ids):
            if t in self.eos_ids:
                done, ids = True, ids[: j + 1]
                break
        if stop:
            n = stop_length(self.tokenizer, ids, stop, min(clean, len(ids)))
            if n is not None:
                return True, ids[:n]
        return done, ids

    def _draft_and_choose(self, st: _Decoding, use_head, sampling, costs, num_drafts,
                          depth_acceptance: DepthAcceptance, room: int | None):
        """This round's drafts [b, k] and, when some sequence samples, their :class:`Draft`
        (what they were drawn from; None at temperature 0: greedy verification compares
        tokens only): n drafted and the
        first k of them kept for verification, fixed (``num_drafts``) or chosen from
        ``costs`` (n planned from the acceptance per depth so far in this call, then k from
        the calibrated confidence of the sequences' drafts), at most ``room`` (None:
        no bound; :meth:`_chain_room`), which is also the size of the chain round that
        stands in for a fixed-size tree round at the end of the context."""
        if costs is None:
            n = room if num_drafts is None else num_drafts
        else:
            n = budget.best_draft_length(depth_acceptance.rates(), costs, st.anchor.shape[0])
        n = n if room is None else min(n, room)
        if n == 0:  # a plain decoding step: nothing is worth drafting
            return st.anchor.new_empty(st.anchor.shape[0], 0), None
        draft = self.drafter.draft(self._drafter_context(st), st.anchor, st.anchor_pos, use_head=use_head,
                                   sampling=sampling, num_drafts=n)
        k = n
        if costs is not None:
            accept_probs = self.drafter.calibration(draft.confidence)
            k = budget.best_verify_length(accept_probs, costs, n)
        return draft.tokens[:, :k], draft.prefix(k) if sampling.any_sampled else None

    @staticmethod
    def _verify_chain(draft_tokens, draft: Draft | None, logits, sampling: RowSampling):
        """Verified tokens [b, k+1] and accepted drafts [b] for drafts [b, k] (``draft``:
        their :class:`Draft`, whose kept distributions are q; None is fine at temperature 0)
        against the target's logits [b, k+1, V]: greedy matching, or rejection sampling
        against the drafter's distribution; k = 0 is a plain step."""
        if draft_tokens.shape[1] == 0:
            token = domino_ops.sample(_sampler_rows(logits[:, 0], sampling), **sampling.op_kwargs())
            return token[:, None], torch.zeros_like(token)
        if not sampling.any_sampled:
            return domino_ops.verify_greedy(draft_tokens, logits)
        # greedy rows of a mixed batch have one-hot p and q: rejection sampling is exact matching
        p = domino_ops.filtered_probs(logits.float(), **sampling.filter_kwargs())
        return domino_ops.verify_sampling(draft_tokens, draft.probs, p, generator=sampling.generator)

    def _speculative(self, seqs, max_new_tokens, sampling: RowSampling, use_head, stop, stream, tree,
                     adaptive: bool, num_drafts: int | None, lookup_tokens: int = 0,
                     datastore_tokens: int = 0, auto: bool = False):
        """The rounds of one call: chain rounds (``tree`` None), tree rounds, or (``auto``,
        with a tree) each round's kind chosen from the measured speed of both. ``adaptive``:
        each round planned by the budget from the costs of the batch size of the rows it
        carries (:meth:`_round_plan`)."""
        b = len(seqs)
        state, first = self._prefill(seqs, sampling)
        state.position_limit = self._position_limit(seqs)
        # the deepest node a tree round may verify: its shape's depth; grafts to num_drafts
        tree_reach = (0 if tree is None else
                      max(tree.depth, self.drafter.config.num_drafts if lookup_tokens or datastore_tokens else 0))
        # each sequence's tokens so far (prompt, output), indexed for prompt lookup; the
        # datastore's proposals read the same token lists
        lookups = ([NgramIndex(list(seqs[s]) + [first[s]]) for s in range(b)]
                   if lookup_tokens or datastore_tokens else None)
        # learnt within this call only, from the drafter's measured rates: a call's choices,
        # and so its sampled output under a seed, do not depend on earlier calls
        # one per round kind: a tree's accepted path is at least as long as its top chain's,
        # so its counts would make chain rounds (under ``kinds``) draft more than they pay;
        # but a tree round also counts its top chain (the chain's draft) in the chain's, so
        # that chain rounds played only now and then plan from evidence, not the prior alone
        depth_acceptance = {kind: DepthAcceptance(self.drafter.config.num_drafts,
                                                  self.drafter.calibration.depth_rates or 0.5)
                            for kind in ROUND_KINDS}
        # per kind of graft, the acceptance of its chains' new tokens, position by position
        graft_acceptance = new_graft_acceptance(lookup_tokens, datastore_tokens)
        out_ids = [[t] for t in first]
        accept: list[list[int]] = [[] for _ in range(b)]
        verified: list[list[int]] = [[] for _ in range(b)]
        done = [False] * b
        for s in range(b):
            done[s], out_ids[s] = self._finished(out_ids[s], max_new_tokens, stop)
            if stream:
                stream(s, list(out_ids[s]))
        sampling = self._leave_finished(state, sampling, done)
        while state.rows:
            rows = state.rows
            costs, kinds = self._round_plan(len(rows), b, adaptive, auto)
            kind = "chain" if tree is None else "tree" if kinds is None else kinds.choose()
            position_room = self._position_room(seqs, out_ids, rows, state.position_limit)
            # at the end of the context: a chain round that fits (not timed for the round
            # kinds: a cut round says nothing of its kind's speed)
            cut = kind == "tree" and position_room is not None and position_room < tree_reach
            kind = "chain" if cut else kind
            room = self._chain_room(out_ids, rows, max_new_tokens, sampling, position_room)
            started = kinds.now() if kinds is not None else 0.0
            # the costs at this round's cache length: attention reads every cached position
            now = costs.at(state.cache_mask.shape[1]) if costs is not None else None
            if kind == "chain":
                kept_list, new_rows, verified_len = self._chain_round(state, sampling, use_head, now,
                                                                      num_drafts, depth_acceptance[kind], room)
            else:
                kept_list, new_rows, verified_len = self._tree_round(
                    state, sampling, use_head, tree, now, depth_acceptance[kind],
                    None if lookups is None else [lookups[s] for s in rows], lookup_tokens,
                    datastore_tokens, graft_acceptance,
                    chain_acceptance=depth_acceptance["chain"] if kinds is not None else None)
            if kinds is not None and not cut:  # the round's host sync has run: its work is done
                kinds.record(kind, sum(kept_list), (kinds.now() - started) * 1e3)
            for i, s in enumerate(rows):
                before = len(out_ids[s])
                if lookups is not None:
                    lookups[s].extend(new_rows[i])
                done[s], out_ids[s] = self._finished(out_ids[s] + new_rows[i], max_new_tokens, stop, before)
                accept[s].append(kept_list[i])
                verified[s].append(verified_len)
                if stream and len(out_ids[s]) > before:
                    stream(s, out_ids[s][before:])
            sampling = self._leave_finished(state, sampling, done)
        return out_ids, accept, verified

    def _round_plan(self, rows: int, batch_size: int, adaptive: bool,
                    auto: bool) -> tuple[RoundCosts | None, RoundKindChooser | None]:
        """What plans a round carrying ``rows`` rows of a call of ``batch_size`` requests:
        the budget's costs (None: not ``adaptive``) and, under ``auto``, the round-kind
        chooser, both of the batch size :func:`domino.budget.cost_batch_size` picks, so that
        once requests have finished the rounds of the others are planned and timed as the
        smaller batch they are (the chooser, kept across calls, is one per such size)."""
        if not adaptive:
            return None, None
        size = budget.cost_batch_size(rows, batch_size)
        kinds = self._round_kinds.setdefault(size, RoundKindChooser()) if auto else None
        return self.round_costs(size), kinds

    @staticmethod
    def _leave_finished(st: _Decoding, sampling: RowSampling, done: list[bool]) -> RowSampling:
        """Drops the rows of ``st`` whose requests are ``done``; returns the sampling
        arguments of the rows left."""
        keep = [i for i, s in enumerate(st.rows) if not done[s]]
        if len(keep) == len(st.rows):
            return sampling
        if not keep:
            st.rows = []
            return sampling
        st.select_rows(keep)
        return sampling.select_rows(keep)

    def _prefill(self, seqs, sampling: RowSampling) -> tuple[_Decoding, list[int]]:
        """The target over the left-padded prompts, the first token and the drafter's context."""
        b = len(seqs)
        ids, mask = self._left_pad(seqs)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = GrowingCache()
        logits, features = self._target_forward(ids, mask, positions, cache, last_logits_only=True)
        anchor = domino_ops.sample(_sampler_rows(logits[:, -1], sampling), **sampling.op_kwargs())
        dcache = self.drafter.new_cache(b, self.device, self.drafter.fc.weight.dtype)
        self.drafter.extend_context(dcache, features, positions, mask)
        return _Decoding(cache, mask, dcache, anchor, positions[:, -1] + 1, rows=list(range(b))), anchor.tolist()

    def _chain_round(self, st: _Decoding, sampling: RowSampling, use_head, costs: RoundCosts | None,
                     num_drafts: int | None, depth_acceptance: DepthAcceptance,
                     room: int | None = None) -> tuple[list[int], list[list[int]], int]:
        """One chain round of at most ``room`` drafts: draft, verify, commit. Returns each
        sequence's kept length (anchor + accepted drafts), its new
        tokens (accepted drafts + one target token) and how many tokens the target verified
        per sequence (the anchor and the drafts)."""
        b, dev = st.anchor.shape[0], st.anchor.device
        draft_tokens, draft = self._draft_and_choose(st, use_head, sampling, costs, num_drafts,
                                                     depth_acceptance, room)
        n = draft_tokens.shape[1]
        block = torch.cat([st.anchor[:, None], draft_tokens], dim=1)
        block_pos = st.anchor_pos[:, None] + torch.arange(n + 1, device=dev)
        logits, features = self._target_forward(block, torch.cat([st.cache_mask, st.cache_mask.new_ones(b, n + 1)], 1),
                                                block_pos, st.cache)
        verified, num_acc = self._verify_chain(draft_tokens, draft, logits, sampling)
        kept = num_acc + 1  # anchor + accepted drafts enter the context
        host = torch.cat([kept[:, None], verified], dim=1).tolist()  # the one host sync of the round
        kept_list = [row[0] for row in host]
        depth_acceptance.update([n] * b, [k - 1 for k in kept_list])
        m = max(kept_list)
        self._commit(st, kept, n + 1, features[:, :m], verified.gather(1, num_acc[:, None])[:, 0])
        return kept_list, [row[1:1 + k] for row, k in zip(host, kept_list)], n + 1

    def _draft_tree(self, st: _Decoding, sampling: RowSampling, use_head, shape: TreeShape,
                    costs: RoundCosts | None) -> tuple[DraftTree, _TreePlan | None]:
        """This round's tree: ``shape.num_draft_tokens`` nodes, or at temperature 0 with
        ``costs`` (the adaptive budget) the number of nodes that maximises expected tokens
        per millisecond, given the drafter's calibrated confidence along every path, the
        measured cost of verifying N tokens and this round's own drafting time; then also
        the plan that chose it (None without the budget)."""
        t0 = time.perf_counter()
        tree = self.drafter.draft_tree(self._drafter_context(st), st.anchor, st.anchor_pos, topk=shape.topk,
                                       depth=shape.depth, num_draft_tokens=shape.num_draft_tokens, use_head=use_head,
                                       sampling=sampling)
        if costs is None or tree.draft_probs is not None:  # a fixed size, or sampled: every draw is verified
            return tree, None
        draft_ms = (time.perf_counter() - t0) * 1e3
        paths = path_acceptance(tree, shape.topk, shape.depth, self.drafter.calibration)
        most = min(shape.max_nodes, len(costs.verify_ms) - 1)  # no larger than the measured verify sizes
        tokens = budget.tree_tokens(paths, tree.candidate_scores)
        N = budget.best_tree_nodes(tokens, costs, draft_ms, most)
        return select_draft_nodes(tree, N), _TreePlan(tokens[N - 1], draft_ms)

    def _graft(self, tree: DraftTree, links: TreeLinks, depth: int, costs: RoundCosts | None,
               plan: _TreePlan | None, lookups: list[NgramIndex], sources: dict[str, int],
               graft_acceptance: dict[str, DepthAcceptance]) -> tuple[torch.Tensor, TreeLinks, int, list]:
        """Grafts each source's chain (``sources``: "lookup", "datastore" -> its most tokens)
        onto the round's tree. With the budget's ``plan`` each source's chains are first cut
        to the new-token count that maximises expected tokens per millisecond
        (:func:`domino.budget.best_graft_length`, from the acceptance per new token so far in
        this call of each sequence's kind of graft: :data:`GRAFT_PRIOR`'s keys; the tree's
        size is chosen before, and a datastore chain that extends the lookup's new nodes is
        scored at the datastore's rates). Returns the candidates, links, depth, and per
        source the grafts offered: (each sequence's kind of graft, the grafts' first node
        index, each sequence's new nodes after the cut, 0 where it proposed nothing new or
        the cut took them all)."""
        candidates, max_depth, made = tree.candidates, self.drafter.config.num_drafts, []

        def propose(name: str, s: int, most: int) -> tuple[list[int], str]:
            if name == "datastore":
                return self.datastore.propose(lookups[s].tokens, most), "datastore"
            chain, match = lookups[s].propose_match(most)
            return chain, lookup_graft_kind(match)

        for name, most in sources.items():
            if not most:
                continue
            chains, graft_kinds = map(list, zip(*(propose(name, s, most) for s in range(len(lookups)))))
            sizes = graft_sizes(candidates, links, chains, max_depth)
            new = [n for _, n in sizes]
            if plan is not None:
                rates = [graft_acceptance[gkind].rates() for gkind in graft_kinds]
                L = budget.best_graft_length(new, rates, plan.tokens, candidates.shape[1], costs, plan.draft_ms)
                plan.tokens += budget.graft_gain(new, rates, L)
                chains = [chain[:i + L] for chain, (i, _) in zip(chains, sizes)]
                new = [min(n, L) for n in new]
            first = candidates.shape[1]
            candidates, links, grafted = graft_chains(candidates, links, chains, max_depth)
            depth = max(depth, grafted)
            made.append((graft_kinds, first, new))
        return candidates, links, depth, made

    def _tree_round(self, st: _Decoding, sampling: RowSampling, use_head, shape: TreeShape,
                    costs: RoundCosts | None, depth_acceptance: DepthAcceptance,
                    lookups: list[NgramIndex] | None = None, lookup_tokens: int = 0,
                    datastore_tokens: int = 0, graft_acceptance: dict[str, DepthAcceptance] | None = None,
                    chain_acceptance: DepthAcceptance | None = None) -> tuple[list[int], list[list[int]], int]:
        """One tree round: draft a tree, verify all its nodes in one target forward, keep the
        accepted path in the caches. Returns what :meth:`_chain_round` does.

        With ``costs`` (the adaptive budget) the round is planned before anything is drafted,
        as a chain round is: where the acceptance per depth so far (seeded by the
        calibration, then counted along each tree's accepted path, which a tree makes at
        least as long as its top chain, up to the tree's depth) says no draft is worth its
        cost, the round is a plain decoding step. The plan reads only earlier rounds, never this round's drafts.
        ``chain_acceptance``: the chain rounds' counts, given how this round's top chain (the
        chain's draft) fared (:func:`domino.tree.top_chain_counts`)."""
        if graft_acceptance is None:  # a round on its own: no counts from earlier rounds
            graft_acceptance = new_graft_acceptance(lookup_tokens, datastore_tokens)
        b = st.anchor.shape[0]
        reachable = shape.depth  # the plan reads the depths a tree of this shape has
        if costs is not None and budget.best_draft_length(depth_acceptance.rates()[:reachable], costs, b) == 0:
            if chain_acceptance is not None:  # a round that drafted nothing: the evidence fades, as for the tree's
                chain_acceptance.update([0] * b, [0] * b)
            return self._chain_round(st, sampling, use_head, None, 0, depth_acceptance)
        tree, plan = self._draft_tree(st, sampling, use_head, shape, costs)
        links = tree_links(tree, st.anchor_pos, shape.topk, shape.depth)
        depth, grafts = shape.depth, []
        if lookups is not None:  # greedy: the prompt-lookup and datastore chains grafted onto the trees
            candidates, links, depth, grafts = self._graft(
                tree, links, depth, costs, plan, lookups,
                {"lookup": lookup_tokens, "datastore": datastore_tokens}, graft_acceptance)
            tree = dataclasses.replace(tree, candidates=candidates)
        n = tree.candidates.shape[1]
        mask = tree_attention_mask(st.cache_mask, links.ancestors, self.target.dtype)
        logits, features = self._target_forward(tree.candidates, mask, links.positions, st.cache)
        verified = verify_tree(tree, links, logits, sampling, depth)  # on the host: the round's one sync
        kept_list = [len(path) for path in verified.path]  # the root (anchor) + accepted drafts enter the context
        depth_acceptance.update(depths_tried(verified), [k - 1 for k in kept_list])
        if chain_acceptance is not None:
            chain_acceptance.update(*top_chain_counts(verified, shape.topk))
        for graft_kinds, first, new in grafts:  # each graft's new nodes on the accepted paths, by kind of graft
            # Only grafts that were verified count: a kind the budget cut to nothing keeps its
            # evidence until the call ends. Letting it fade back to the prior instead (an
            # update with 0 verified) re-grafted chains that mostly failed: on the Zen 3 VM the
            # default ran 1.02x and the tree 1.00x the adaptive chain, against 1.07x and 1.05x
            # without (results/e2e_graft_fading_zen3_session46.txt).
            for gkind in {graft_kinds[s] for s in range(b) if new[s]}:
                offered = [s for s in range(b) if graft_kinds[s] == gkind and new[s]]
                graft_acceptance[gkind].update(
                    [new[s] for s in offered],
                    [sum(first <= u < first + new[s] for u in verified.path[s]) for s in offered])
        m = max(kept_list)
        # back on the device in one copy (on a GPU, one wait): the kept counts, the next
        # anchors (the target's tokens) and the kept paths [b, m], root-padded
        back = torch.tensor(kept_list + [t[-1] for t in verified.tokens]
                            + [u for p in verified.path for u in p + [0] * (m - len(p))], device=tree.candidates.device)
        kept, next_anchor, path = back[:b], back[b:2 * b], back[2 * b:].view(b, m)
        # Nothing to move when every sequence's kept path already sits in the round's first
        # slots (the root alone, or the root and its first child): common at tau ~2, and the
        # move copies every layer's accepted slots (~0.2 ms a round for SmolLM2's 30 layers in
        # the cache's one storage: benchmarks/engine_steps_micro.py).
        if any(p != list(range(len(p))) for p in verified.path):
            compact_tree_cache(st.cache, path, n)
        path_features = features.gather(1, path[:, :, None].expand(-1, -1, features.shape[2]))
        self._commit(st, kept, n, path_features, next_anchor)
        return kept_list, verified.tokens, n

    def _commit(self, st: _Decoding, kept: torch.Tensor, round_len: int, features: torch.Tensor,
                next_anchor: torch.Tensor) -> None:
        """Keeps the first m = max(kept) of the round's ``round_len`` target cache slots
        (the anchor and the accepted drafts, in path order; slots past a sequence's own
        ``kept`` [b] become masked holes), queues their target ``features`` [b, m, n*H] for
        the drafter's context (:meth:`_drafter_context`), and moves the anchor to
        ``next_anchor`` [b]."""
        m = features.shape[1]
        if round_len > m:
            st.cache.crop(-(round_len - m))
        valid = torch.arange(m, device=kept.device)[None, :] < kept[:, None]
        st.cache_mask = torch.cat([st.cache_mask, valid], dim=1)
        positions = st.anchor_pos[:, None] + torch.arange(m, device=kept.device)
        st.pending_context.append((features, positions, valid))
        st.anchor = next_anchor
        st.anchor_pos = st.anchor_pos + kept

    def _drafter_context(self, st: _Decoding) -> DraftContextCache:
        """The drafter's context cache with every committed round in it: the rounds queued
        since the last draft extend it in one call. Rounds the budget plans as plain
        steps draft nothing, so a run of them costs one call instead of one each (~0.6-1 ms
        a call on the CPU); the context is the same as round by round (its products, norms
        and rotations act on each position alone; bit for bit on the batch-invariant CPU
        kernels)."""
        if st.pending_context:
            features, positions, valid = (torch.cat(parts, dim=1) for parts in zip(*st.pending_context))
            st.pending_context.clear()
            self.drafter.extend_context(st.dcache, features, positions, valid)
        return st.dcache

    # ---- the baselines ----------------------------------------------------------------

    @torch.inference_mode()
    def generate_plain(self, prompt: prompts.Prompts, *, max_new_tokens: int = 256, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0,
                       sampling: SamplingParams | Sequence[SamplingParams] | None = None, stop: Sequence[str] = (),
                       generator: torch.Generator | None = None,
                       stream: Callable[[int, list[int]], None] | None = None) -> GenerationResult:
        """Plain decoding by the engine's own loop: the target alone, one forward and one
        :func:`domino_ops.sample` per token, on the KV cache and kernels speculation uses.
        Takes :meth:`generate`'s request arguments (prompts, sampling, seeds, ``stop``,
        ``stream``) and returns its result, one round per token. Greedy, it decodes what
        :meth:`generate_target_only` does; sampled, it draws from the same filtered
        distribution with the C++ sampler, which HF ``generate``'s logits warpers (a sort of
        the vocabulary for top-p) make the faster plain decoding on a CPU: the baseline a
        sampled speedup is measured against."""
        seqs, batch, stop = self._encode_request(prompt, max_new_tokens, stop)
        params = self._sampling_params(len(seqs), temperature, top_k, top_p, sampling)
        self._check_stream_and_generator(stream, generator)
        rows = RowSampling.from_params(params, self.device, generator)
        t0 = time.perf_counter()
        with model_fixed(self.target):
            token_ids = self._plain_decoding(seqs, max_new_tokens, rows, stop, stream)
        ones = [[1] * len(t) for t in token_ids]
        return self._result(token_ids, ones, ones, time.perf_counter() - t0, batch, stop)

    def _plain_decoding(self, seqs, max_new_tokens: int, sampling: RowSampling, stop: list[str],
                        stream) -> list[list[int]]:
        """Each sequence's tokens, one target forward and one sample per token until every
        sequence is done (a sequence that finishes leaves the batch, as in the speculative
        loop: HF's batched ``generate`` has finished ones ride along)."""
        b = len(seqs)
        ids, mask = self._left_pad(seqs)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = GrowingCache()
        out_ids: list[list[int]] = [[] for _ in range(b)]
        rows = list(range(b))  # the request each row of the batch decodes
        while rows:
            logits = self.target(input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=True,
                                 logits_to_keep=1, **{self._cache_kw: cache}).logits
            token = domino_ops.sample(_sampler_rows(logits[:, -1], sampling), **sampling.op_kwargs())
            keep = []
            for i, (s, t) in enumerate(zip(rows, token.tolist())):
                before = len(out_ids[s])
                done, out_ids[s] = self._finished(out_ids[s] + [t], max_new_tokens, stop, before)
                if stream and len(out_ids[s]) > before:
                    stream(s, out_ids[s][before:])
                if not done:
                    keep.append(i)
            ids, positions = token[:, None], positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            if len(keep) < len(rows) and keep:
                index = torch.tensor(keep, dtype=torch.int64, device=ids.device)
                cache.batch_select_indices(index)
                ids, positions, mask = ids[index], positions[index], mask[index]
                sampling = sampling.select_rows(keep)
            rows = [rows[i] for i in keep]
        return out_ids

    @torch.inference_mode()
    def generate_target_only(self, prompt: prompts.Prompts, *, max_new_tokens: int = 256, temperature: float = 0.0,
                             top_k: int = 0, top_p: float = 1.0, **generate_kwargs) -> GenerationResult:
        """Plain decoding with the target's own HF ``generate`` (the baseline), on the KV cache
        speculation uses (:class:`domino.kv_cache.GrowingCache`, unless ``cache`` /
        ``past_key_values`` is given); other keyword
        arguments go to HF's ``generate`` (e.g. ``prompt_lookup_num_tokens``). It takes none
        of :meth:`generate`'s own (``stop``, ``sampling``, ``generator``, ``stream``, and the
        drafting ones: ``use_head``, ``num_drafts``, ``tree``, ``lookup_tokens``,
        ``datastore_tokens``), each refused by name: HF's ``stop_strings`` (with
        ``tokenizer=``) and ``torch.manual_seed`` are its ways to stop and seed. It returns
        one sequence a prompt, as :meth:`generate`: ``num_return_sequences`` other than 1 is
        refused (repeat the prompt in a batch instead)."""
        for name in ("stop", "sampling", "generator", "stream", "use_head", "num_drafts", "tree", "lookup_tokens",
                     "datastore_tokens"):
            if name in generate_kwargs:
                raise TypeError(f"generate_target_only takes no {name}= (generate's own; see its docstring)")
        # HF would return n rows a prompt, which the result (one a prompt) would drop or misalign
        if (n := generate_kwargs.get("num_return_sequences", 1)) not in (1, None):
            raise ValueError(f"num_return_sequences must be 1 (got {n!r}): generate_target_only returns one sequence "
                             "a prompt; repeat the prompt in a batch for more")
        seqs, batch, _ = self._encode_request(prompt, max_new_tokens)
        domino_ops.check_sampling_params(temperature, top_k, top_p)
        ids, mask = self._left_pad(seqs)
        sampled = domino_ops.sampling.may_sample(temperature)  # below GREEDY_BELOW: the argmax, as generate's
        kw = dict(do_sample=sampled, max_new_tokens=max_new_tokens, pad_token_id=self.pad_id,
                  # None, not [], for a target without an end token: HF's beam search reads
                  # eos_token_id[0] of a non-None list (an IndexError, transformers 5.25)
                  eos_token_id=self.eos_ids or None)
        if sampled:
            kw.update(temperature=temperature, top_k=top_k or None, top_p=top_p)
        else:
            kw.update(temperature=None, top_k=None, top_p=None)
        if not {"cache", "past_key_values"} & generate_kwargs.keys():
            kw[self._cache_kw] = GrowingCache()  # like for like with speculation
        kw.update(generate_kwargs)
        # the target's own distribution, as speculation; held fixed, as the engine's loops hold it
        with bare_generation_config(self.target), model_fixed(self.target):
            t0 = time.perf_counter()
            out = self.target.generate(input_ids=ids, attention_mask=mask.long(), **kw)
            elapsed = time.perf_counter() - t0
        token_ids = []
        for row in out[:, ids.shape[1]:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in self.eos_ids), len(row))
            token_ids.append(row[:cut])
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in token_ids]
        total = sum(len(t) for t in token_ids)
        res = GenerationResult(texts, token_ids, [[1] * len(t) for t in token_ids], total / elapsed, elapsed)
        if not batch:
            res.text, res.token_ids, res.acceptance_lengths = texts[0], token_ids[0], res.acceptance_lengths[0]
        return res
