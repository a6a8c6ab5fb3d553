"""How many drafted tokens to verify each round, chosen from measured costs.

A round drafts n tokens and verifies a prefix of k <= n of them in one target forward over
k + 1 tokens (the anchor and the k drafts). It yields ``1 + accepted`` tokens and costs
``draft_ms(n) + verify_ms(k + 1)``. Long-run speed is tokens per millisecond, so each
round picks the size that maximises expected tokens over expected cost:

- before drafting, n from the acceptance rate seen so far at each depth (a running mean,
  :class:`DepthAcceptance`), because drafting n positions costs LM-head rows and head
  steps for every one of them; none unless drafting is expected to beat a plain step by
  :data:`DRAFT_MARGIN`;
- after drafting, k from the drafter's own confidence in each drafted token, mapped to a
  probability of acceptance by :class:`Calibration` (the drafter's softmax is not a
  calibrated acceptance probability: it is fitted on measured rounds, see
  ``benchmarks/calibration.py``).

With per-position acceptance probabilities a_1..a_k (each given the prefix before it was
accepted), the expected tokens of a round are ``1 + sum_j prod_{i<=j} a_i``; a batch shares
one target forward, so the batch's choice maximises the sum over its live sequences.

The costs (:class:`RoundCosts`) are measured once per target, drafter, dtype, device,
machine and thread count by :func:`measure_round_costs`, at two cache lengths, and cached on
disk as JSON (:func:`round_costs`): a different machine, model or dtype gets a fresh
measurement. Each round reads them at its own cache length (:meth:`RoundCosts.at`) and
batch size: once requests of a batch have finished and left it, the rows still running
(:func:`cost_batch_size`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Sequence

import torch

import domino_ops
from domino_ops import cpu

__all__ = ["Calibration", "DepthAcceptance", "RoundCosts", "best_draft_length", "best_graft_length", "best_tree_nodes",
           "best_tree_size", "best_verify_length", "cost_batch_size", "cost_batch_sizes", "cost_key", "expected_tokens",
           "graft_gain", "measure_round_costs", "round_costs", "tree_tokens"]

# Sizes timed by measure_round_costs; the others are interpolated linearly between them.
_TIMED_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# The cache lengths the round costs are measured at: a round's costs are interpolated
# linearly between them by its own cache length (attention reads every cached position, so
# verifying t tokens grows costlier with the context, and faster the larger t is: on the Zen
# 3 VM a 9-token verification cost 1.66x a 1-token one at 128 cached positions and 2.24x at
# 2,048; measured at 128 alone, the plan verified too much on long prompts).
_CONTEXTS = (128, 1024)
# Tokens a timed drafting round adds to the drafter's context first: about what a round keeps
# (tau ~2-3 on the shipped drafter).
_KEPT_PER_ROUND = 2


@dataclass(frozen=True)
class RoundCosts:
    """Measured milliseconds of a round's two parts, for one batch size.

    ``verify_ms[t]``: one target forward over t new tokens per sequence (t = 1 .. len-1;
    entry 0 unused; up to 32 or the drafter's block, for trees), with a KV cache, as a
    verification round runs it.
    ``draft_ms[n]``: drafting n tokens per sequence (n = 0 .. len-1; 0 costs nothing):
    the drafter's context extension by the tokens kept since its last draft, the backbone,
    base logits at n positions, the head over them and the calibration of their confidences.
    Both with ``context`` positions cached (0: not recorded). ``verify_ms_long`` and
    ``draft_ms_long``, when measured, are the same at ``long_context`` positions: :meth:`at`
    interpolates a round's costs between the two by its own cache length.
    """

    verify_ms: tuple[float, ...]
    draft_ms: tuple[float, ...]
    batch_size: int = 1
    key: str = ""
    context: int = 0
    long_context: int = 0
    verify_ms_long: tuple[float, ...] = ()
    draft_ms_long: tuple[float, ...] = ()

    def __post_init__(self):
        if self.verify_ms_long or self.draft_ms_long:
            if (len(self.verify_ms_long), len(self.draft_ms_long)) != (len(self.verify_ms), len(self.draft_ms)):
                raise ValueError("round costs: the long-context tables must have the short ones' sizes")
            if not 0 < self.context < self.long_context:
                raise ValueError(f"round costs: context ({self.context}) and long_context ({self.long_context}) "
                                 "must be two cache lengths, the shorter first")
            if any(b < a for a, b in zip(self.verify_ms + self.draft_ms, self.verify_ms_long + self.draft_ms_long)):
                raise ValueError("round costs: a longer context never costs less, but a long-context entry is "
                                 "below its short-context one")

    def at(self, context: int) -> "RoundCosts":
        """These costs for a round with ``context`` positions cached per sequence: linear in
        the cache length through the two measured, and beyond the longer on the same line
        (attention's work is linear in it); below the shorter, the shorter's (a steep
        measured slope must not extrapolate a cheap round to nothing); themselves when one
        context was measured."""
        if not self.verify_ms_long:
            return self
        w = max(context - self.context, 0) / (self.long_context - self.context)

        def mix(short, long):
            return tuple(a + w * (b - a) for a, b in zip(short, long))

        return RoundCosts(mix(self.verify_ms, self.verify_ms_long), mix(self.draft_ms, self.draft_ms_long),
                          self.batch_size, self.key, context)

    @property
    def max_drafts(self) -> int:
        """The most drafts per sequence a round may plan with these costs (both tables
        cover it, with the bonus token verified)."""
        return min(len(self.draft_ms), len(self.verify_ms) - 1) - 1

    def round_ms(self, n: int, k: int) -> float:
        """Milliseconds of a round that drafts n tokens and verifies k of them."""
        return self.draft_ms[n] + self.verify(k + 1)

    def verify(self, t: int) -> float:
        """Milliseconds of a target forward over t tokens (flat beyond the largest measured)."""
        return self.verify_ms[min(t, len(self.verify_ms) - 1)]

    def to_json(self) -> str:
        """These costs as one JSON object (:meth:`from_json` reads it back)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RoundCosts":
        """Parses :meth:`to_json`'s output; ValueError for anything else (another shape,
        missing or non-finite entries)."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError(f"round costs must be a JSON object, got {type(d).__name__}")
        lists = []
        for name in ("verify_ms", "draft_ms", "verify_ms_long", "draft_ms_long"):
            v = d.get(name, [])
            if name.endswith("_long") and v == []:  # one context measured
                lists.append(())
                continue
            if (not isinstance(v, list) or len(v) < 2 or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf") for x in v)):
                raise ValueError(f"round costs: {name} must be a list of at least 2 finite non-negative numbers")
            lists.append(tuple(float(x) for x in v))
        batch_size, key = d.get("batch_size", 1), d.get("key", "")
        context, long_context = d.get("context", 0), d.get("long_context", 0)
        if not isinstance(batch_size, int) or not isinstance(key, str):
            raise ValueError("round costs: batch_size must be an int and key a string")
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in (context, long_context)):
            raise ValueError("round costs: context and long_context must be ints >= 0")
        return cls(lists[0], lists[1], batch_size, key, context, long_context, lists[2], lists[3])


def interpolate(points: dict[int, float], n_max: int) -> tuple[float, ...]:
    """Values at 0..n_max, linear between the measured sizes, flat beyond them; entry 0 is 0."""
    xs = sorted(points)
    out = [0.0]
    for n in range(1, n_max + 1):
        j = bisect_right(xs, n)
        if j == 0:
            out.append(points[xs[0]])
        elif j == len(xs) or xs[j - 1] == n:
            out.append(points[xs[j - 1]])
        else:
            x0, x1 = xs[j - 1], xs[j]
            out.append(points[x0] + (points[x1] - points[x0]) * (n - x0) / (x1 - x0))
    return tuple(out)


# ---- acceptance ------------------------------------------------------------------------


@dataclass
class Calibration:
    """Maps the drafter's probability of a drafted token to the probability the target
    accepts it (given the tokens before it were accepted): a monotone step function over
    ``edges`` (ascending bin upper edges in [0, 1]) with ``rates`` per bin. Identity when
    empty."""

    edges: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    # measured acceptance at each draft depth (given the depths before it were accepted):
    # the prior of DepthAcceptance, which plans how many tokens to draft
    depth_rates: list[float] = field(default_factory=list)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Acceptance probabilities, the shape and device of ``confidence`` (float32)."""
        c = confidence.float()
        if not self.edges:
            return c.clamp(0.0, 1.0)
        edges = torch.tensor(self.edges[:-1], dtype=torch.float32, device=c.device)
        rates = torch.tensor(self.rates, dtype=torch.float32, device=c.device)
        return rates[torch.bucketize(c.clamp(0.0, 1.0), edges, right=True)]

    @classmethod
    def fit(cls, confidence: Sequence[float], accepted: Sequence[bool], bins: int = 10,
            prior: float = 1.0, depth: Sequence[int] | None = None) -> "Calibration":
        """Histogram binning into equal-count bins, smoothed by ``prior`` pseudo-counts at the
        bin's mean confidence, then made monotone (pool adjacent violators): a more
        confident draft never maps to a lower acceptance probability. ``depth`` (each
        draft's 0-based position in its round) also gives the per-depth rates."""
        pairs = sorted(zip((float(c) for c in confidence), (bool(a) for a in accepted)))
        if not pairs:
            return cls()
        depth_rates = []
        if depth is not None:
            for d in range(max(depth) + 1):
                sel = [a for a, dd in zip(accepted, depth) if dd == d]
                depth_rates.append((sum(sel) + 0.5) / (len(sel) + 1.0))
        bins = max(1, min(bins, len(pairs)))
        groups = [pairs[i * len(pairs) // bins:(i + 1) * len(pairs) // bins] for i in range(bins)]
        groups = [g for g in groups if g]
        stats = []  # [upper edge, accepted, count, weight-mean confidence]
        for g in groups:
            mean_c = sum(c for c, _ in g) / len(g)
            stats.append([g[-1][0], sum(a for _, a in g) + prior * mean_c, len(g) + prior])
        pooled: list[list[float]] = []
        for edge, acc, cnt in stats:  # pool adjacent violators on rate = acc / cnt
            pooled.append([edge, acc, cnt])
            while len(pooled) > 1 and pooled[-2][1] / pooled[-2][2] > pooled[-1][1] / pooled[-1][2]:
                e, a, n = pooled.pop()
                pooled[-1] = [e, pooled[-1][1] + a, pooled[-1][2] + n]
        edges = [p[0] for p in pooled]
        edges[-1] = 1.0
        return cls(edges, [p[1] / p[2] for p in pooled], depth_rates)

    def save(self, path: str | Path) -> None:
        """Writes this calibration as JSON to ``path`` (:meth:`load` reads it back)."""
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """The calibration stored at ``path``, or the identity if there is none."""
        path = Path(path)
        if not path.exists():
            return cls()
        d = json.loads(path.read_text())
        return cls(list(d["edges"]), list(d["rates"]), list(d.get("depth_rates", [])))


class DepthAcceptance:
    """Running acceptance rate at each draft depth, given the depths before it were
    accepted: a prior of ``prior_weight`` pseudo-rounds at ``prior`` (one rate, or one per
    depth, e.g. ``Calibration.depth_rates``) plus the recent rounds, each round's evidence
    fading by a factor ``1 - 1 / memory`` per later round. Used to plan how many tokens to
    draft.

    Why forget: acceptance changes along a response (a code block drafts well, the prose
    after it less), and a plan that stopped drafting learns nothing more, so evidence kept
    forever would stop drafting for the rest of the request after one bad stretch. Faded
    back towards the prior, the plan drafts again after ~``memory`` plain rounds and
    measures anew."""

    def __init__(self, depths: int, prior: float | Sequence[float] = 0.5, prior_weight: float = 4.0,
                 memory: float = 32.0):
        if not memory >= 1.0:
            raise ValueError(f"memory must be >= 1 round, got {memory!r}")
        rates = [prior] * depths if isinstance(prior, (int, float)) else list(prior)[:depths]
        rates += [rates[-1] if rates else 0.5] * (depths - len(rates))
        self.prior_accepted = [r * prior_weight for r in rates]
        self.prior_tried = [prior_weight] * depths
        self.accepted = list(self.prior_accepted)
        self.tried = list(self.prior_tried)
        self.keep = 1.0 - 1.0 / memory

    def rates(self) -> list[float]:
        """Per depth, the faded estimate of the probability that a draft at that depth is
        accepted given the ones before it were."""
        return [a / t for a, t in zip(self.accepted, self.tried)]

    def update(self, verified: Sequence[int], accepted: Sequence[int]) -> None:
        """One round: per sequence, how many drafts were verified and how many accepted
        (a round that drafted nothing only lets the evidence fade)."""
        for d in range(len(self.tried)):
            self.accepted[d] = self.prior_accepted[d] + (self.accepted[d] - self.prior_accepted[d]) * self.keep
            self.tried[d] = self.prior_tried[d] + (self.tried[d] - self.prior_tried[d]) * self.keep
        for k, a in zip(verified, accepted):
            for d in range(min(k, a + 1, len(self.tried))):  # depth d was tried iff the d before it were accepted
                self.tried[d] += 1
                self.accepted[d] += d < a


def expected_tokens(accept_probs: torch.Tensor) -> torch.Tensor:
    """Expected tokens of a round verifying the first k drafts, for every k = 0..n.

    accept_probs: [b, n] float32, the probability that draft i is accepted given drafts
    before it were. Returns [n + 1] float32: ``sum over the batch of 1 + sum_{j<=k}
    prod_{i<=j} a_i``."""
    b, n = accept_probs.shape
    reach = torch.cumprod(accept_probs.float(), dim=1)  # [b, n]: P(the first j+1 drafts accepted)
    per_k = torch.cat([reach.new_zeros(b, 1), reach.cumsum(1)], dim=1) + 1.0
    return per_k.sum(0)


def best_verify_length(accept_probs: torch.Tensor, costs: RoundCosts, n: int) -> int:
    """The drafts k in 0..n to verify this round (n of them drafted): the first k at which
    verifying one more would lower the expected tokens per millisecond.

    A stopping rule, not the argmax over all k: whether draft i is verified then depends
    only on the acceptance probabilities up to position i + 1, which depend on the drafts
    before i + 1 and not on draft i + 1 itself. Verification by rejection sampling stays
    exact under such a rule (a rule that looked at later positions would tilt which drafts
    get verified). accept_probs: [b, >=n] float32 for the batch's live sequences."""
    exp = expected_tokens(accept_probs[:, :n]).tolist()
    k = 0
    while k < n and exp[k + 1] / costs.round_ms(n, k + 1) > exp[k] / costs.round_ms(n, k):
        k += 1
    return k


# How much faster than a plain step a drafting round must be expected to run before the plan
# drafts at all. The plan drafts when its running acceptance estimate is high, so at the
# moments it acts the estimate is biased upwards (a winner's curse): on the Zen 3 VM, batches
# of 4, the depth-1 rate it planned with averaged 0.773 where those rounds realized 0.675, at
# a break-even near 0.67, and it ran at 0.96-0.97x plain decoding where never drafting is
# 1.00x (benchmarks/budget_replay.py, which replays plans offline from measured acceptance;
# measured end to end, benchmarks/bench_budget.py: 0.93-0.97x against 0.96-1.01x). Where
# drafting pays, the expected gain is far above the margin and the plan barely changes:
# replayed, batch 1 1.45x either way, batch 2 1.26-1.28x either way on HumanEval and 1.13x
# against 1.14x on chat. The cost tables' own noise on a shared VM (~10 % from minute to
# minute) is a second reason not to act on a small expected edge.
DRAFT_MARGIN = 0.1


def best_draft_length(depth_rates: Sequence[float], costs: RoundCosts, live: int = 1,
                      margin: float = DRAFT_MARGIN) -> int:
    """The number of tokens n to draft (0 .. max) maximising expected tokens per
    millisecond if all n are verified, from per-depth acceptance rates; 0 unless that beats
    a plain step's by the fraction ``margin`` (:data:`DRAFT_MARGIN`)."""
    n_max = min(costs.max_drafts, len(depth_rates))
    rates = torch.tensor(list(depth_rates[:n_max]), dtype=torch.float32).expand(live, n_max)
    exp = expected_tokens(rates).tolist()
    speed = [exp[n] / costs.round_ms(n, n) for n in range(n_max + 1)]
    n = max(range(n_max + 1), key=speed.__getitem__)
    return n if speed[n] > speed[0] * (1.0 + margin) else 0


def tree_tokens(path_probs: torch.Tensor, scores: torch.Tensor) -> list[float]:
    """Expected tokens a greedy tree round advances the b sequences, summed, when the
    N - 1 best candidates by cumulative draft log-probability ``scores`` [b, M] are kept
    (as EAGLE-2 selects them), for N = 1..M+1 (entry N - 1). ``path_probs`` [b, M]: each
    candidate's probability of lying on the accepted path (``domino.tree.path_acceptance``);
    a kept set closed under ancestors accepts, in expectation, the sum of its members', and
    every sequence advances by the target's own token besides."""
    order = torch.argsort(scores, dim=1, descending=True)
    gain = path_probs.gather(1, order).sum(0).cumsum(0).tolist()  # [M]: N - 1 = 1..M kept
    b = path_probs.shape[0]
    return [float(b)] + [b + g for g in gain]


def best_tree_size(path_probs: torch.Tensor, scores: torch.Tensor, costs: RoundCosts, draft_ms: float,
                   max_nodes: int) -> int:
    """The nodes N in 2..max_nodes (root included) of a greedy tree to verify this round,
    maximising expected tokens per millisecond (:func:`tree_tokens`) when the N - 1 best
    candidates are kept. ``draft_ms``: the tree's drafting cost."""
    return best_tree_nodes(tree_tokens(path_probs, scores), costs, draft_ms, max_nodes)


def best_tree_nodes(tokens: Sequence[float], costs: RoundCosts, draft_ms: float, max_nodes: int) -> int:
    """:func:`best_tree_size` from the expected tokens of each size (:func:`tree_tokens`)."""
    return max(range(2, max_nodes + 1), key=lambda N: tokens[N - 1] / (draft_ms + costs.verify(N)))


def graft_gain(new_tokens: Sequence[int], rates: Sequence[Sequence[float]], length: int) -> float:
    """Expected tokens that the first ``length`` new tokens of grafted chains add, summed
    over the sequences: sequence s offers ``new_tokens[s]``, and ``rates[s][j]`` is the
    probability that its chain's new token j is accepted given the ones before it were (the
    first one's includes the target reaching the chain's attachment node)."""
    total = 0.0
    for n, r in zip(new_tokens, rates):
        reach = 1.0
        for rate in r[:min(n, length)]:
            reach *= rate
            total += reach
    return total


def best_graft_length(new_tokens: Sequence[int], rates: Sequence[Sequence[float]], tokens: float, nodes: int,
                      costs: RoundCosts, draft_ms: float) -> int:
    """How many new tokens L of each sequence's grafted chain (prompt lookup, datastore) to
    verify this round with a greedy tree of ``nodes`` nodes expected to advance ``tokens``
    tokens: the L in 0..max(new_tokens) maximising expected tokens per millisecond, where
    the L new tokens add :func:`graft_gain` (``rates``: one list per sequence) and the round
    verifies ``nodes`` plus the most any sequence adds (the forward is one for the batch).
    A chain's first tokens are the gamble (once right, a copy tends to go on right), and
    each node costs verification time, so on a CPU where verifying one more token costs
    milliseconds only the likely chains pay. ``draft_ms``: the tree's drafting cost, as
    :func:`best_tree_size` counts it. No larger than the measured verification sizes
    allow (``costs.verify`` is flat past them, which would make more nodes look free)."""
    most = max(0, min(max(new_tokens, default=0), len(costs.verify_ms) - 1 - nodes))
    return max(range(most + 1), key=lambda L: (tokens + graft_gain(new_tokens, rates, L)) /
               (draft_ms + costs.verify(nodes + L)))


# ---- costs -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def kernels_fingerprint() -> str:
    """A hash of the compiled domino_ops extension's bytes: a rebuilt kernel (a new
    release, a local change) can change every cost, so cached costs must not outlive it."""
    from domino_ops import _C

    return hashlib.sha256(Path(_C.__file__).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def python_fingerprint() -> str:
    """A hash of the installed domino and domino_ops Python sources
    (:func:`sources_fingerprint`): the forwards and the decode loop are Python too (a
    release that runs the drafter on other kernels changes what drafting costs), so cached
    costs must not outlive them either."""
    import domino_ops

    import domino

    return sources_fingerprint((domino, domino_ops))


def sources_fingerprint(packages) -> str:
    """A hash of the ``.py`` files under each package's folder (names, lengths, bytes);
    where a package's sources are not files in a folder, the installed domino-ops version
    stands in for them."""
    import importlib.metadata

    h = hashlib.sha256()
    for package in packages:
        where = getattr(package, "__file__", None)
        root = Path(where).parent if where else None
        paths = sorted(root.rglob("*.py")) if root is not None and root.is_dir() else []
        if not paths:
            try:
                version = importlib.metadata.version("domino-ops")
            except importlib.metadata.PackageNotFoundError:
                version = "unknown"
            h.update(f"{package.__name__} version {version}\n".encode())
        for path in paths:
            data = path.read_bytes()
            # name and length before the bytes: no two trees hash alike by where one file ends
            h.update(f"{path.relative_to(root)} {len(data)}\n".encode())
            h.update(data)
    return h.hexdigest()[:16]


def cost_key(gen, batch_size: int) -> str:
    """What the costs depend on: the models' shapes and dtypes, the drafter's draft
    vocabulary, the device, the machine, torch's version and thread count, the compiled
    kernels and domino's Python sources, whether the small-batch linear is on (under the
    target, and under the drafter with its fused layers; packed, and its forced path, and the
    packed product: AMX or vectors), the target's attention implementation (and the
    small-batch attention's forced score path), whether its
    forward is :mod:`domino.fast_forward`'s, the batch size."""
    from domino.fast_forward import uses_fast_forward
    from domino.fast_layers import uses_fused_layers
    from domino.fast_linear import runs_packed, uses_small_batch_linear

    target = gen.target
    dev = gen.device
    parts = {
        "target": target.config.to_json_string(use_diff=False),
        "target_dtype": str(next(target.parameters()).dtype),
        "drafter": json.dumps(gen.drafter.config.to_json_dict(), sort_keys=True),
        "drafter_dtype": str(gen.drafter.fc.weight.dtype),
        "draft_vocab": None if gen.drafter.draft_vocab is None
        else hashlib.sha256(gen.drafter.draft_vocab.cpu().numpy().tobytes()).hexdigest(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu.model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernels": kernels_fingerprint(),
        "python": python_fingerprint(),
        "small_batch_linear": uses_small_batch_linear(target),
        "drafter_small_batch_linear": uses_small_batch_linear(gen.drafter),
        "drafter_fused_layers": uses_fused_layers(gen.drafter),
        "small_batch_linear_packed": any(runs_packed(m, dt) for m in target.modules()
                                         for dt in (torch.bfloat16, torch.float32)),
        "small_batch_linear_isa": cpu.kernel_switch_value("DOMINO_SMALL_BATCH_LINEAR_ISA") or "",
        "small_batch_linear_packed_path": domino_ops.small_batch_linear_packed_path()
        if domino_ops.small_batch_linear_packed_supported() else "",
        "attention": target.config._attn_implementation,
        "small_batch_attention_scores": cpu.kernel_switch_value("DOMINO_SMALL_BATCH_ATTENTION_SCORES") or "",
        "fast_forward": uses_fast_forward(target),
        "batch_size": batch_size,
        "cpu_isa": cpu.isa(),  # the build running (DOMINO_CPU_ISA, or forced_isa)
        "measurement": 8,  # how measure_round_costs times (2: drafting after a target forward; 3: suffix-min
        # envelope; 4: the sizes interleaved; 5: drafting with its context extension and calibration;
        # 6: at two cache lengths; 7: the models held fixed, as the generator holds them; 8: the
        # drafter's context in stores that grow in place, so drafting at the long length is cheaper)
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _min_ms(fns: dict, repeats: int, before=None) -> dict:
    """{key: the fastest of ``repeats`` timed calls of fns[key]} after one warm-up round;
    the calls interleaved, a round of every key at a time, so that a slow stretch of the
    machine (a VM's speed can swing by a third over seconds) hits every size alike instead
    of whichever sizes were timed during it: other load only ever adds time, and a cached
    cost must not keep a moment's contention. (Timed one size after another, a 2-core Zen
    3 VM once measured 8 tokens at 50.8 ms and 12 at 78.1, and the budget then verified 12
    tokens a round where 8-9 had paid.) ``before``, when given, runs untimed before each
    call (to leave the caches as a round leaves them)."""
    best = {key: float("inf") for key in fns}
    for i in range(repeats + 1):  # the first round is the warm-up
        for key, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            if i:
                best[key] = min(best[key], (time.perf_counter() - t0) * 1e3)
    return best


def _nondecreasing(values: tuple[float, ...]) -> tuple[float, ...]:
    """Each size's time as the least measured at it or any larger size: more tokens never
    cost less, and other load only ever adds time, so a size measured slower than a larger
    one was disturbed. (A running maximum let one disturbed small size, e.g. a 2-token
    verification timed at 1.4x a 1-token one, raise every larger size to it, and the
    budget then stopped drafting.)"""
    return tuple(reversed(list(accumulate(reversed(values), min))))


class _RoundSetup:
    """A target KV cache and a drafter context of ``context`` positions per sequence, with a
    verification and a drafting to time over them as a round runs them. The first
    ``prefill`` positions are a real prompt's (random tokens); the rest repeat their keys,
    values and features (what they hold does not change what a forward costs, and a real
    prefill of a long context would cost seconds)."""

    def __init__(self, gen, batch_size: int, context: int, prefill: int, t_max: int, g: torch.Generator):
        from domino.kv_cache import GrowingCache

        self.gen, self.b, self.context = gen, batch_size, context
        dev = self.dev = gen.device
        vocab = gen.target.config.get_text_config().vocab_size
        prefill = min(prefill, context)
        ids = torch.randint(0, vocab, (batch_size, prefill), generator=g).to(dev)
        positions = torch.arange(context, device=dev).expand(batch_size, context)
        mask = torch.ones(batch_size, context, dtype=torch.bool, device=dev)
        self.cache = GrowingCache()  # as generation's
        _, features = gen._target_forward(ids, mask[:, :prefill], positions[:, :prefill], self.cache,
                                          last_logits_only=True)
        reps = -(-context // prefill)
        if context > prefill:  # the rest of the context: the prompt's keys and values again
            for i, layer in enumerate(self.cache.layers):
                self.cache.update(layer.keys.repeat(1, 1, reps - 1, 1)[:, :, :context - prefill],
                                  layer.values.repeat(1, 1, reps - 1, 1)[:, :, :context - prefill], i)
        self.features = features.repeat(1, reps, 1)[:, :context]
        self.positions, self.mask = positions, mask
        self.dcache = gen.drafter.new_cache(batch_size, dev, gen.drafter.fc.weight.dtype)
        gen.drafter.extend_context(self.dcache, self.features, positions, mask)
        self.anchor = ids[:, -1]
        self.anchor_pos = torch.full((batch_size,), context, device=dev)
        self.new = torch.randint(0, vocab, (batch_size, t_max), generator=g).to(dev)

    def verify(self, t: int) -> None:
        """A target forward over t new tokens per sequence, cropped back after."""
        b, c, dev = self.b, self.context, self.dev
        self.gen._target_forward(self.new[:, :t], torch.ones(b, c + t, dtype=torch.bool, device=dev),
                                 c + torch.arange(t, device=dev).expand(b, t), self.cache)
        self.cache.crop(-t)

    def draft(self, n: int) -> None:
        """A drafting round's work, the context left as it was: a drafting round first extends
        the drafter's context by what the rounds since the last draft kept
        (DominoGenerator._drafter_context), then drafts, then maps the confidences to
        acceptance probabilities for the verify length; all of it is the price of drafting,
        which a plain step does not pay. (Timing the drafter's forward alone left ~1-2 ms a
        drafting round out of the table on the Zen 3 VM.)"""
        dcache, drafter = self.dcache, self.gen.drafter
        kept = slice(self.context - _KEPT_PER_ROUND, self.context)
        saved = dcache.length
        drafter.extend_context(dcache, self.features[:, kept], self.positions[:, kept], self.mask[:, kept])
        d = drafter.draft(dcache, self.anchor, self.anchor_pos, num_drafts=n)
        expected_tokens(drafter.calibration(d.confidence)).tolist()
        dcache.length = saved  # what was appended forgotten (DraftContextCache)


@torch.inference_mode()
def measure_round_costs(gen, batch_size: int = 1, contexts: tuple[int, int] = _CONTEXTS,
                        repeats: int = 5) -> RoundCosts:
    """Times a target verification forward over t tokens and a drafting of n tokens, as a
    round runs them (a KV cache of each of ``contexts`` positions, cropped back after each
    forward; each drafting right after a target forward, with the drafter's context
    extension before it and the calibration of its confidences after), at the sizes in
    ``_TIMED_SIZES`` up to the drafter's block, interpolated in between; the fastest of
    ``repeats`` per size (every size at both contexts timed in interleaved rounds), made
    non-decreasing in size. The longer context is cut to what the target's positions
    allow; where that leaves none longer than the first, the costs hold one context."""
    short, long = contexts
    if not 0 < short < long:
        raise ValueError(f"contexts must be two cache lengths, the shorter first, got {contexts!r}")
    n_max = gen.drafter.config.num_drafts
    t_max = max(n_max + 1, _TIMED_SIZES[-1])  # trees verify more tokens than a chain
    most = getattr(gen.target.config.get_text_config(), "max_position_embeddings", None)
    if most is not None:
        long = min(long, most - t_max - _KEPT_PER_ROUND)
    from domino.fast_forward import model_fixed

    g = torch.Generator().manual_seed(0)
    lengths = (short, long) if long > short else (short,)
    # the models held fixed, as the generator holds them across its rounds (their per-call
    # checks would add ~1 ms to every size)
    with model_fixed(gen.target), gen.drafter.weights_fixed():
        setups = {c: _RoundSetup(gen, batch_size, c, short, t_max, g) for c in lengths}
        sizes = [t for t in _TIMED_SIZES if t <= t_max]
        verify_pts = _min_ms({(c, t): functools.partial(s.verify, t) for c, s in setups.items() for t in sizes},
                             repeats)
        # Drafting follows a target forward in every round, which leaves the drafter's weights
        # out of the caches: timed back to back instead, drafting measured ~60 % of what it
        # costs in generation (SmolLM2, bf16, Zen 5 VM: 2.3 ms vs 3.9 ms a round), so the
        # budget drafted where it did not pay.
        draft_pts = _min_ms({(c, n): functools.partial(s.draft, n) for c, s in setups.items() for n in sizes
                             if n <= n_max}, repeats, before=functools.partial(setups[short].verify, 1))

    def tables(c):
        verify = _nondecreasing(interpolate({t: ms for (cc, t), ms in verify_pts.items() if cc == c}, t_max))
        draft = _nondecreasing(interpolate({n: ms for (cc, n), ms in draft_pts.items() if cc == c}, n_max))
        return verify, draft

    verify, draft = tables(short)
    key = cost_key(gen, batch_size)
    if len(setups) == 1:
        return RoundCosts(verify, draft, batch_size, key, short)
    # more context never costs less: a long-context size timed below the short one was disturbed
    verify_long, draft_long = (tuple(map(max, a, b)) for a, b in zip(tables(long), (verify, draft)))
    return RoundCosts(verify, draft, batch_size, key, short, long, verify_long, draft_long)


def cost_batch_sizes(batch_size: int) -> tuple[int, ...]:
    """The batch sizes whose costs a call of ``batch_size`` requests plans with: the call's
    own, and the powers of two below it, for the rounds after requests have finished and
    left the batch (:func:`cost_batch_size`). Ascending.

    Why more than one: a verification's cost grows with the rows it carries, so the call's
    table overprices a round once rows have left, and the plan then drafts too little for
    the requests still running. On the Zen 4 VM (SmolLM2, bf16, the shipped drafter, 128
    cached positions) a 5-token verification costs 20.1 ms at batch 4 and 11.0 ms at batch
    1, where one token costs 11.8 and 11.0: from the calibration's acceptance per depth, the
    last request of a batch of 4 planned with batch 4's table drafts 2 tokens a round, and
    with batch 1's, 7. Why powers of two and not every size: each table is a measurement of
    seconds (4.2 / 5.3 / 7.6 / 8.5 s at batch 1 / 2 / 3 / 4 there), once per machine, and
    a batch of 64 on a GPU must not measure 64 (``benchmarks/round_costs_by_batch.py``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return tuple(1 << i for i in range(batch_size.bit_length()) if 1 << i < batch_size) + (batch_size,)


def cost_batch_size(rows: int, batch_size: int) -> int:
    """The batch size of the measured costs that plan a round carrying ``rows`` rows in a
    call of ``batch_size``: the smallest of :func:`cost_batch_sizes` at or above ``rows``
    (a table of more rows than the round carries overprices it, by at most the cost of
    twice its rows, and the plan drafts a little less than would pay; one of fewer rows
    would underprice it, and the plan would draft what does not pay)."""
    sizes = cost_batch_sizes(batch_size)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= batch_size:
        raise ValueError(f"rows must be an int in 1..{batch_size} (the call's batch size), got {rows!r}")
    return next(size for size in sizes if size >= rows)


def cost_cache_dir() -> Path:
    """Where measured round costs are cached (``round_costs`` under :func:`domino.loading.cache_dir`)."""
    from domino.loading import cache_dir

    return cache_dir() / "round_costs"


def round_costs(gen, batch_size: int = 1, *, remeasure: bool = False) -> RoundCosts:
    """The round costs for ``gen`` at ``batch_size``: from the disk cache when this model,
    dtype, machine and thread count were measured before, else measured now (a few
    seconds) and stored."""
    key = cost_key(gen, batch_size)
    path = cost_cache_dir() / f"{key}.json"
    n_max = gen.drafter.config.num_drafts
    if not remeasure:
        try:
            costs = RoundCosts.from_json(path.read_text())
            if costs.key == key and costs.max_drafts >= n_max:
                return costs
        except (OSError, ValueError):
            pass  # missing, unreadable, corrupt or old: measure again
    costs = measure_round_costs(gen, batch_size)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(costs.to_json())
        tmp.replace(path)  # atomic: concurrent processes never read half a file
    except OSError as e:  # a read-only cache: the costs still serve this process
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        warnings.warn(f"could not store the round costs in {path} ({e}); they will be measured again next time",
                      RuntimeWarning, stacklevel=2)
    return costs
