"""The instruction-set builds of the CPU kernels: selection (DOMINO_CPU_ISA), and the
vector code's edge cases on every build this machine supports. (Every test of the CPU
kernels' own files also runs once per build: see conftest.py.)"""

import os
import subprocess
import sys

import pytest
import torch

import domino_ops
from domino_ops import cpu, reference
from kernel_cases import head_rollout_inputs
from oracles import head_rollout_oracle

SUPPORTED = cpu.supported_isas()


def run_python(code: str, isa: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("DOMINO_CPU_ISA", None)
    if isa is not None:
        env["DOMINO_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_builds_listed_widest_first():
    compiled = cpu.compiled_isas()
    assert SUPPORTED and set(SUPPORTED) <= set(compiled)
    assert SUPPORTED == [name for name in compiled if name in SUPPORTED]
    assert cpu.model()


def test_auto_picks_the_widest_supported_build():
    for isa in (None, "auto", ""):
        got = run_python("from domino_ops import cpu; print(cpu.isa())", isa)
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == SUPPORTED[0]


@pytest.mark.parametrize("isa", SUPPORTED)
def test_env_var_forces_a_build(isa):
    code = ("import os, torch, domino_ops; from domino_ops import cpu\n"
            "x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))\n"
            "assert torch.equal(domino_ops.sample(x), x.argmax(-1))\n"
            "os.environ['DOMINO_CPU_ISA'] = 'no-such-build'  # read once: ignored from now on\n"
            "assert torch.equal(domino_ops.sample(x), x.argmax(-1))\n"
            "print(cpu.isa())")
    got = run_python(code, isa)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == isa


def test_env_var_unknown_build_is_a_clear_error():
    code = ("import torch, domino_ops; from domino_ops import cpu\n"
            "for f in (cpu.isa, lambda: domino_ops.sample(torch.randn(2, 5))):\n"
            "    try:\n"
            "        f()\n"
            "    except ValueError as e:\n"
            "        print(e)\n"
            "    else:\n"
            "        raise SystemExit('no error')\n")
    got = run_python(code, "avx9000")
    assert got.returncode == 0, got.stderr
    lines = got.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "DOMINO_CPU_ISA='avx9000' is not a CPU kernel build" in line
        assert all(name in line for name in cpu.compiled_isas())


def test_env_var_unsupported_build_is_a_clear_error():
    missing = [name for name in cpu.compiled_isas() if name not in SUPPORTED]
    if not missing:
        pytest.skip("this CPU runs every compiled build")
    got = run_python("from domino_ops import cpu; cpu.isa()", missing[0])
    assert got.returncode != 0
    assert f"this CPU does not support the {missing[0]} build" in got.stderr
    assert "builds this machine runs: " + ", ".join(SUPPORTED) in got.stderr


def test_forced_isa_validates_and_restores():
    before = cpu.isa()
    with pytest.raises(ValueError, match="not a CPU kernel build"):
        with cpu.forced_isa("avx9000"):
            pass
    for isa in SUPPORTED:
        with cpu.forced_isa(isa):
            assert cpu.isa() == isa
        assert cpu.isa() == before
    # nested: the inner block's end goes back to the outer one's build (it had gone back to
    # the default, and the rest of the outer block silently ran another build)
    with cpu.forced_isa(SUPPORTED[-1]):
        for isa in SUPPORTED:
            with cpu.forced_isa(isa):
                assert cpu.isa() == isa
            assert cpu.isa() == SUPPORTED[-1]
    assert cpu.isa() == before


# ---- vector-code edge cases, per build ---------------------------------------------------

@pytest.fixture(params=SUPPORTED)
def isa(request):
    with cpu.forced_isa(request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 3, 15, 16, 17, 63, 64, 65, 130, 1000, 70000])
def test_argmax_ties_nans_and_infinities(isa, dtype, n):
    g = torch.Generator().manual_seed(n)
    rows = torch.randn(8, n, generator=g).to(dtype)
    if n > 2:
        rows[1, n // 3] = rows[1, n - 1] = 100.0  # a tie across lanes / the tail: first wins
        rows[2, n - 1] = float("nan")  # NaN wins, as torch.argmax
        rows[3, n // 2] = float("nan")
        rows[3, n // 4] = float("nan")
    rows[4] = float("-inf")  # every value -inf: index 0
    rows[5] = 7.0  # all equal: index 0
    rows[6, n - 1] = float("inf")
    got = domino_ops.sample(rows)
    assert torch.equal(got, rows.float().argmax(-1)), (isa, got.tolist())
    draft = rows.float().argmax(-1)[:, None]
    out, acc = domino_ops.verify_greedy(draft, rows[:, None].expand(8, 2, n).contiguous())
    assert torch.equal(out[:, 0], rows.float().argmax(-1)) and (acc == 1).all()


@pytest.mark.parametrize("V", [1, 3, 63, 64, 65, 130, 1000, 4099])
@pytest.mark.parametrize("m", [1, 3, 8, 32, 33])
def test_expand_children_follow_the_greedy_order(isa, V, m):
    """The expand's children scan (a vector skip to the next value above the m-th kept, up
    to m = 32; a partial sort past it) against the exact greedy order: with w2 = 0 each
    node's logits are its base row, here rounded to halves (ties everywhere), with NaNs
    (none, fewer than m, more than m), +-inf, a maximum in the tail and in the first block."""
    m = min(m, V)
    g = torch.Generator().manual_seed(V * 100 + m)
    n, G, r = 8, 4, 2
    base = (torch.randn(n, 1, V, generator=g) * 2).round() / 2
    row = base[:, 0]
    row[1, V - 1] = 50.0  # the maximum in the tail
    row[2, 0] = 50.0  # and at index 0
    row[3, torch.randperm(V, generator=g)[:max(1, m // 2)]] = float("nan")
    row[4, torch.randperm(V, generator=g)[:min(V, m + 2)]] = float("nan")  # more NaNs than children
    row[5, V // 2] = float("inf")
    row[5, V // 3] = float("-inf")
    row[6] = float("-inf")
    row[7] = 3.0  # all tied: the first m indices
    gru_input, w_hh = torch.randn(V, 3 * G, generator=g), torch.randn(3 * G, G, generator=g)
    t, lp, _, L = domino_ops.domino_head_expand(
        base, torch.zeros(n, 1, r), torch.randn(n, G, generator=g), torch.arange(n), torch.zeros(n, dtype=torch.long),
        gru_input, None, w_hh, torch.randn(r, G, generator=g), torch.zeros(V, r), num_children=m)
    torch.testing.assert_close(L, row, rtol=0, atol=0, equal_nan=True)
    key = torch.where(row.isnan(), float("inf"), row)  # NaN first, then descending, ties by index
    want = torch.tensor([sorted(range(V), key=lambda j, i=i: (-key[i, j].item(), j))[:m] for i in range(n)])
    assert torch.equal(t, want), isa


@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_rollout_every_batch_block_matches_float64(isa, b, wdtype):
    """Batch sizes hit every activation block (8, 4, 2, 1 and their sums), r every column
    tail for 4-, 8- and 16-lane builds, V a partial vocabulary tile."""

    for r, seed in ((96, 1), (45, 2), (8, 3)):
        inputs = head_rollout_inputs(b, 3, 1000, r, 40, 24, wdtype, torch.bfloat16, b % 2 == 0, seed)
        tokens_ref, lp_ref, S_ref, _, margins = head_rollout_oracle(*inputs)
        tokens, lp, S = domino_ops.domino_head_rollout(*inputs)
        ok = (margins > 1e-3).all(-1)  # sequences whose argmax is no coin toss
        assert ok.any()
        assert torch.equal(tokens[ok], tokens_ref[ok])
        torch.testing.assert_close(lp[ok], lp_ref[ok].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(S[ok], S_ref[ok].float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_its_batch(isa, wdtype):
    """rows_dot computes every (weight row, activation) dot product with the same arithmetic
    whatever the batch and its position in it (the batch-1 rows-outer kernel, the
    interleaved blocks of several activations, their leftover rows and activations): a
    node's expand logits, children and states, and a sequence's rollout tokens,
    log-probabilities and state, are bit-identical alone and inside batches of every size
    and order. V leaves partial row blocks and chunks; r a column tail on every build."""
    for r, seed in ((96, 1), (45, 2), (8, 3)):
        n, V, G = 17, 1003, 40
        base, hproj, state, gru_input, _, w_hh, w1s, w2 = head_rollout_inputs(n, 3, V, r, G, 24, wdtype,
                                                                              torch.float32, True, seed)
        g = torch.Generator().manual_seed(seed)
        seq, depth = torch.randint(0, n, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)

        def expand(idx):
            return domino_ops.domino_head_expand(base, hproj, state[idx], seq[idx], depth[idx], gru_input, None,
                                                 w_hh, w1s, w2, num_children=3)

        whole = expand(torch.arange(n))
        for idx in [torch.tensor([i]) for i in range(n)] + [torch.randperm(n, generator=g)[:m] for m in (2, 3, 5, 16)]:
            for got, want in zip(expand(idx), whole):
                assert torch.equal(got, want[idx]), (isa, r, idx.tolist())
        rolled = domino_ops.domino_head_rollout(base, hproj, state, gru_input, None, w_hh, w1s, w2)
        for i in (0, 5, n - 1):
            alone = domino_ops.domino_head_rollout(base[i:i + 1], hproj[i:i + 1], state[i:i + 1], gru_input, None,
                                                  w_hh, w1s, w2)
            for got, want in zip(alone, rolled):
                assert torch.equal(got[0], want[i]), (isa, r, i)


def test_write_logits_rounds_bf16_like_torch(isa):
    """The bf16 write-back rounds to nearest even like torch's float -> bf16 cast."""

    inputs = head_rollout_inputs(2, 2, 777, 33, 16, 8, torch.float32, torch.bfloat16, True, 5)
    base16 = inputs[0].clone()
    domino_ops.domino_head_rollout(base16, *inputs[1:], write_logits=True)
    base32 = inputs[0].float()  # the same base values, so the same float logits
    domino_ops.domino_head_rollout(base32, *inputs[1:], write_logits=True)
    assert torch.equal(base16, base32.to(torch.bfloat16))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 50, 1.0), (1.2, 0, 0.9), (1.0, 40, 0.5)])
def test_sampling_matches_reference_at_vocabulary_scale(isa, temperature, top_k, top_p):
    """Same uniforms, a 151936-token vocabulary: the kernel picks the reference's token in
    every row (the top-p shortcut sorts only the tokens that can be in the nucleus); float64
    rounding (a vectorised exp, summation order) could move a draw only for a uniform
    within ~1e-13 of a CDF or nucleus boundary, which none of these 32 rows is."""
    logits = torch.randn(32, 151936, generator=torch.Generator().manual_seed(2)) * 3
    got = domino_ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                            generator=torch.Generator().manual_seed(3))
    want = reference.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                            generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, want)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.2, 50, 1.0), (1.0, 40, 0.5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_filtered_probs_matches_reference_at_vocabulary_scale(isa, temperature, top_k, top_p, dtype):
    """Each build's tempering and float64 exponentials write the reference's law over a
    151936-token vocabulary (up to their rounding); the argmax's one-hot exactly."""
    logits = (torch.randn(5, 151936, generator=torch.Generator().manual_seed(6)) * 3).to(dtype)
    got = domino_ops.filtered_probs(logits, temperature, top_k, top_p)
    want = reference.filtered_probs(logits, temperature, top_k, top_p)
    if temperature == 0.0:
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-37)


def test_verify_sampling_matches_reference_at_vocabulary_scale(isa):
    g = torch.Generator().manual_seed(4)
    b, k, V = 4, 3, 151936
    q = torch.softmax(torch.randn(b, k, V, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 2, -1)
    p[:, :k] = 0.5 * p[:, :k] + 0.5 * q
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, k)
    got = domino_ops.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(9))
    want = reference.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(9))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("where", ["tie", "nan", "max_late"])
def test_argmax_of_a_row_split_across_threads(isa, where):
    """Rows of more than 2 x 4M elements are split across threads (argmax.h): the merge
    keeps the first index on ties and the first NaN."""
    n = (1 << 23) + 37
    row = torch.randn(1, n, generator=torch.Generator().manual_seed(1))
    if where == "tie":
        row[0, 5] = row[0, n - 3] = 50.0
    elif where == "nan":
        row[0, n - 2] = float("nan")
        row[0, n // 2 + 1] = float("nan")
    else:
        row[0, n - 1] = 60.0
    assert torch.equal(domino_ops.sample(row), row.argmax(-1))


# ---- the kernels' switches (DOMINO_SMALL_BATCH_*), read once -----------------------------

def test_kernel_switches_are_read_once_and_switched_by_name():
    """The switches come from the environment at import: a later os.environ
    write changes nothing (read at every call, a write in another thread had raced the
    kernels' getenv: a segfault); kernel_switch sets one for a block, nested blocks
    restore the enclosing value, and a bad name or value type is refused."""
    name = "DOMINO_SMALL_BATCH_LINEAR_ISA"
    before = cpu.kernel_switch_value(name)
    path = domino_ops.small_batch_linear_isa()
    os.environ[name] = "generic"
    try:
        assert cpu.kernel_switch_value(name) == before and domino_ops.small_batch_linear_isa() == path
    finally:
        del os.environ[name]
    with cpu.kernel_switch(name, "generic"):
        assert domino_ops.small_batch_linear_isa() == "generic"
        with cpu.kernel_switch(name, None):
            assert domino_ops.small_batch_linear_isa() == path
        assert cpu.kernel_switch_value(name) == "generic"
    assert cpu.kernel_switch_value(name) == before and domino_ops.small_batch_linear_isa() == path
    with pytest.raises(ValueError, match="a kernel switch must be one of"):
        cpu.kernel_switch_value("DOMINO_CPU_ISA")
    assert name in cpu.KERNEL_SWITCHES and len(set(cpu.KERNEL_SWITCHES)) == 3
    for other in cpu.KERNEL_SWITCHES:  # each one the kernels take
        assert cpu.kernel_switch_value(other) is None or isinstance(cpu.kernel_switch_value(other), str)
    with pytest.raises(TypeError, match="value must be a str or None"):
        with cpu.kernel_switch(name, 2):
            pass
    # a fresh process reads the variable at import
    env = dict(os.environ, **{name: "generic"})
    code = "import domino_ops; print(domino_ops.small_batch_linear_isa())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "generic"
