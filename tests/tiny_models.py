"""Tiny randomly initialised targets and drafters for fast engine tests."""

from __future__ import annotations

import torch

from domino import DominoConfig, DominoDraftModel, DominoGenerator
from domino.fast_layers import use_fused_layers
from domino.fast_linear import use_small_batch_linear


class IdTokenizer:
    """Stands in for a HF tokenizer: prompts are token ids; decode joins ids."""

    chat_template = None
    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) % 64 for t in text.split()]}


def tiny_target(kind: str = "qwen3", vocab: int = 64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif kind == "qwen2":  # biased q/k/v projections
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():  # sharper logits than the default init, so greedy paths are stable
        model.lm_head.weight.mul_(8.0)
        # HF initialises every RMSNorm weight to 1 and every bias to 0, which would hide a
        # kernel or fast path that ignores a norm's weight or drops a bias: random ones,
        # from a generator of their own (the other weights stay the seed's)
        g = torch.Generator().manual_seed(1000 + seed)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def tiny_drafter(target, *, seed: int = 1, **over) -> DominoDraftModel:
    kw = dict(num_hidden_layers=1, num_feature_layers=3, mask_token_id=target.config.vocab_size - 1,
              block_size=8, emb_dim=8, gru_hidden_dim=16, pure_draft_prefix_len=1)
    kw.update(over)
    torch.manual_seed(seed)
    return DominoDraftModel(DominoConfig.from_target(target.config, **kw)).eval()


def tiny_generator(kind="qwen3", vocab=64, **drafter_kw) -> DominoGenerator:
    target = tiny_target(kind, vocab)
    return DominoGenerator(target, tiny_drafter(target, **drafter_kw), IdTokenizer())


class RowsOfTheRound:
    """For a rigged drafter: which request each row of a round's batch decodes (a finished
    request leaves the batch, so row i is request i only until one has), read from the
    generator's decoding state as it asks for the drafter's context, just before drafting."""

    def __init__(self, gen: DominoGenerator):
        self.gen, self.rows = gen, None
        context = gen._drafter_context

        def recording(st):
            self.rows = list(st.rows)
            return context(st)

        gen._drafter_context = recording

    def sequences(self, full: list, b: int) -> list:
        """``full``'s entries (one per request) for the round's b rows."""
        rows = self.rows if self.rows is not None and len(self.rows) == b else range(b)
        return [full[r] for r in rows]

    def restore(self):
        self.gen.__dict__.pop("_drafter_context", None)  # the class's method again


class RiggedDrafts:
    """Replaces drafter.draft with the target's known greedy continuation, optionally
    corrupting the first draft on every other round (full and zero acceptance alternate)."""

    def __init__(self, gen: DominoGenerator, full_sequences: list[list[int]], alternate: bool = False):
        self.gen, self.full, self.alternate, self.round = gen, full_sequences, alternate, 0
        self.original = gen.drafter.draft
        self.rows = RowsOfTheRound(gen)
        gen.drafter.draft = self

    def __call__(self, cache, anchor, anchor_pos, **kw):
        from domino.model import Draft

        n = kw.get("num_drafts") or self.gen.drafter.config.num_drafts
        V = self.gen.drafter.config.vocab_size
        rows = []
        for seq, p in zip(self.rows.sequences(self.full, anchor.shape[0]), anchor_pos.tolist()):
            row = [seq[q] if q < len(seq) else 1 for q in range(p + 1, p + 1 + n)]
            if self.alternate and self.round % 2 == 1:
                row[0] = (row[0] + 1) % V
            rows.append(row)
        self.round += 1
        tokens = torch.tensor(rows, dtype=torch.int64)
        logits = torch.nn.functional.one_hot(tokens, V).float() * 20.0
        return Draft(tokens, logits, torch.ones(tokens.shape))

    def restore(self):
        self.gen.drafter.draft = self.original
        self.rows.restore()


def cpu_target(kind: str = "llama", dtype=torch.bfloat16, attn: str | None = None, seed: int = 0):
    """A tiny target (vocabulary 64) in ``dtype``; ``attn``: None (HF's default), an HF
    attention implementation ("sdpa", "eager") or "small_batch"
    (domino.fast_attention.use_small_batch_attention)."""
    from domino.fast_attention import use_small_batch_attention

    model = tiny_target(kind, 64, seed=seed).to(dtype)
    if attn == "small_batch":
        use_small_batch_attention(model)
    elif attn is not None:
        model.config._attn_implementation = attn
    return model


def verify_and_step(model, prompt_len: int = 20, k: int = 9, seed: int = 1):
    """Logits of one forward over k tokens and of k one-token forwards, from the same cache
    after a random prompt: ([1, k, V], [1, k, V])."""
    import copy

    from transformers import DynamicCache

    from domino.target import cache_kwarg

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 64, (1, prompt_len), generator=g)
    block = torch.randint(0, 64, (1, k), generator=g)
    kv = cache_kwarg(model.forward)
    with torch.inference_mode():
        c1 = DynamicCache()
        model(input_ids=prompt, use_cache=True, **{kv: c1})
        c2 = copy.deepcopy(c1)
        big = model(input_ids=block, use_cache=True, **{kv: c1}).logits
        steps = torch.cat([model(input_ids=block[:, i:i + 1], use_cache=True, **{kv: c2}).logits
                           for i in range(k)], 1)
    return big, steps


def fused_drafter(dtype, *, layers: int, seed: int, **over) -> DominoDraftModel:
    """A tiny drafter on the small-batch linear and the fused layers (as use_cpu_kernels
    sets it up), its norm weights random and each norm its own eps (q's and k's one), so
    that a weight or eps read for another shows."""
    tgt = cpu_target("qwen3", dtype)
    d = tiny_drafter(tgt, num_hidden_layers=layers, seed=seed, **over)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    for layer in d.layers:
        layer.input_layernorm.variance_epsilon = float(torch.empty(1).uniform_(1e-3, 0.5, generator=g))
        layer.post_attention_layernorm.variance_epsilon = float(torch.empty(1).uniform_(1e-3, 0.5, generator=g))
        eps = float(torch.empty(1).uniform_(1e-3, 0.5, generator=g))
        layer.self_attn.q_norm.variance_epsilon = layer.self_attn.k_norm.variance_epsilon = eps
    d = d.to(dtype).bind_target(tgt)
    return use_fused_layers(use_small_batch_linear(d))
