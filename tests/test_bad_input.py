"""Bad input raises a clear Python exception naming the argument, never a crash."""

import pytest
import torch

import domino_ops


def check_bad_input(fn, args: dict, over: dict, exc: type[Exception], msg: str) -> None:
    """``fn(**args)`` with the entries of ``over`` replacing those of ``args`` (one row of a
    bad-input table) raises ``exc`` with a message matching the regex ``msg``."""
    with pytest.raises(exc, match=msg):
        fn(**{**args, **over})


def head(b=2, k=3, V=50, r=4, G=6, H=5, table=True):
    args = dict(base_logits=torch.randn(b, k, V), hproj=torch.randn(b, k, r), state=torch.randn(b, G),
                gru_input=torch.randn(V, 3 * G) if table else torch.randn(V, H),
                w_ih=None if table else torch.randn(3 * G, H), w_hh=torch.randn(3 * G, G),
                w1s=torch.randn(r, G), w2=torch.randn(V, r))
    return args


def call_head(**over):
    kw = {k: over.pop(k) for k in ["temperature", "top_k", "top_p", "generator", "write_logits"] if k in over}
    args = head(table=over.pop("table", True))
    args.update(over)
    return domino_ops.domino_head_rollout(*args.values(), **kw)


HEAD_CASES = [
    (dict(base_logits=torch.randn(2, 50)), ValueError, "base_logits must have 3 dimensions"),
    (dict(base_logits=torch.randn(2, 3, 50, dtype=torch.float64)), TypeError, "base_logits must be float32 or bfloat16"),
    (dict(base_logits=torch.randn(2, 50, 3).transpose(1, 2)), ValueError, "base_logits must be contiguous"),
    (dict(base_logits=torch.randn(2, 0, 50)), ValueError, "base_logits must not be empty"),
    (dict(hproj=torch.randn(2, 3, 5)), ValueError, r"hproj must have shape \[2, 3, 4\]"),
    (dict(hproj=torch.randn(1, 3, 4)), ValueError, "hproj must have shape"),
    (dict(state=torch.randn(2, 7)), ValueError, r"state must have shape \[2, 6\]"),
    (dict(state=torch.randn(2, 6, dtype=torch.bfloat16)), TypeError, "state must be float32"),
    (dict(w2=torch.randn(49, 4)), ValueError, r"w2 must have shape \[50, 4\]"),
    (dict(w2=torch.randn(50, 4).to(torch.int32)), TypeError, "w2 must be"),
    (dict(w1s=torch.randn(4, 6, dtype=torch.bfloat16)), TypeError, "w1s must be float32"),
    (dict(w_hh=torch.randn(17, 6)), ValueError, r"w_hh must have shape \[18, 6\]"),
    (dict(w_hh=torch.randn(6, 18).T), ValueError, "w_hh must be contiguous"),
    (dict(gru_input=torch.randn(50, 17)), ValueError, "gru_input .*table.* must have shape"),
    (dict(table=False, w_ih=torch.randn(18, 4)), ValueError, r"w_ih must have shape \[18, 5\]"),
    (dict(table=False, gru_input=torch.randn(49, 5)), ValueError, "gru_input .*embedding.* must have shape"),
    (dict(w2="w2"), TypeError, "w2 must be a torch.Tensor"),
    (dict(temperature=-0.1), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=float("inf")), ValueError, "temperature must be finite and >= 0"),
    # past float32's largest value the kernels' float32 temperature would be inf: every token tied
    (dict(temperature=1e39), ValueError, r"temperature must be finite and >= 0 \(finite in float32"),
    (dict(temperature=10 ** 400), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=torch.tensor([1.0, 1e39], dtype=torch.float64)), ValueError,
     r"temperature must be finite and >= 0 in every row \(finite in float32\)"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an int"),
    (dict(generator="seed"), TypeError, "generator must be a torch.Generator"),
    (dict(write_logits=1), TypeError, "write_logits must be a bool"),
]


@pytest.mark.parametrize("over,exc,msg", HEAD_CASES)
def test_head_rollout_bad_input(over, exc, msg):
    with pytest.raises(exc, match=msg):
        call_head(**over)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_head_rollout_mixed_devices():
    with pytest.raises(ValueError, match="w2 is on"):
        call_head(w2=torch.randn(50, 4, device="cuda"))


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_head_rollout_refuses_base_logits_sharing_memory(backend):
    """base_logits (written with write_logits) over another argument's memory: one rule
    and one exception for every backend (the reference overwrote w2 while reading it)."""
    args = head()
    w2 = torch.randn(100, 4)  # w2 [50, 4] and base_logits [2, 3, 50] over one buffer
    args["w2"] = w2[:50]
    args["base_logits"] = w2.view(-1)[100:400].view(2, 3, 50)
    for write in (True, False):
        with pytest.raises(ValueError, match="base_logits must not share memory with w2"):
            domino_ops.domino_head_rollout(*args.values(), write_logits=write, backend=backend)


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_head_rollout_refuses_to_overwrite_a_protected_tensor(backend):
    """write_logits=True overwrites base_logits in place: a tensor autograd tracks, or an
    inference tensor outside inference mode, is refused by name (the native kernel wrote
    over both, the reference raised autograd's own error)."""
    args = head()
    args["base_logits"] = torch.randn(2, 3, 50, requires_grad=True)
    with pytest.raises(ValueError, match="base_logits is overwritten in place, but requires grad"):
        domino_ops.domino_head_rollout(*args.values(), write_logits=True, backend=backend)
    with torch.inference_mode():
        args["base_logits"] = torch.randn(2, 3, 50)
    with pytest.raises(ValueError, match="base_logits is overwritten in place, but is an inference tensor"):
        domino_ops.domino_head_rollout(*args.values(), write_logits=True, backend=backend)
    with torch.inference_mode():  # inside it, as the engine calls it: fine
        domino_ops.domino_head_rollout(*args.values(), write_logits=True, backend=backend)
    args["base_logits"] = torch.randn(2, 3, 50, requires_grad=True)  # read only: fine under no_grad
    with torch.no_grad():
        domino_ops.domino_head_rollout(*args.values(), backend=backend)
    with pytest.raises(RuntimeError, match="base_logits requires grad and grad mode is on"):  # no backward
        domino_ops.domino_head_rollout(*args.values(), backend=backend)


FILTERED_PROBS_CASES = [
    (dict(temperature=float("nan")), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=-1.0), ValueError, "temperature must be finite and >= 0"),
    (dict(top_k=-3), ValueError, "top_k must be >= 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an int"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=2.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=torch.tensor([0.5, 0.5, 0.5])), ValueError, r"top_p as a tensor must have shape \[2\]"),
    (dict(logits=torch.randn(2, 5, dtype=torch.float64)), TypeError, "logits must be float32 or bfloat16"),
    (dict(logits=torch.randn(2, 5).long()), TypeError, "logits must be float32 or bfloat16"),
    (dict(logits=torch.randn(5)), ValueError, "logits must have 2 dimensions"),
    (dict(logits=torch.randn(2, 0)), ValueError, "logits must not be empty"),
    (dict(logits=torch.randn(0, 5)), ValueError, "logits must not be empty"),
]


@pytest.mark.parametrize("over,exc,msg", FILTERED_PROBS_CASES)
def test_filtered_probs_bad_input(over, exc, msg):
    """filtered_probs (the p and q verify_sampling takes) validates as the sampling ops do:
    it used to turn a NaN temperature into NaN probabilities and a negative one into the
    argmax, and to ignore a negative top_k or a top_p past 1."""
    kw = dict(logits=torch.randn(2, 5))
    kw.update(over)
    with pytest.raises(exc, match=msg):
        domino_ops.filtered_probs(kw.pop("logits"), **kw)


def test_uniforms_need_one_generator_per_row():
    """A generator list of the wrong length is refused (it used to return uninitialised
    memory for an empty list, and fewer rows than asked for a short one), and
    expand_uniforms refuses a node of a sequence the list has no generator for (it used to
    clamp it to the last one)."""
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    for shape, g in [((4,), []), ((4,), gens), ((1, 3), gens)]:
        with pytest.raises(ValueError, match="generator as a list must have one generator per row"):
            domino_ops.draw_uniforms(shape, "cpu", g)
    with pytest.raises(ValueError, match=r"node_seq must hold values in \[0, 2\)"):
        domino_ops.sampling.expand_uniforms(torch.tensor([0, 1, 5]), 2, gens)
    with pytest.raises(ValueError, match=r"node_seq must hold values in \[0, 0\)"):
        domino_ops.sampling.expand_uniforms(torch.tensor([0]), 2, [])
    assert domino_ops.sampling.expand_uniforms(torch.tensor([1, 0, 1]), 2, gens).shape == (3, 2)


@pytest.mark.parametrize("shape,device,generator,exc,msg", [
    ("x", "cpu", None, ValueError, "shape must be a sequence of ints >= 0"),
    ((2, -1), "cpu", None, ValueError, "shape must be a sequence of ints >= 0"),
    ((2, 1.5), "cpu", None, ValueError, "shape must be a sequence of ints >= 0"),
    (torch.Size([2, 3]), 3, None, TypeError, "device must be a torch.device or a string"),
    ((2, 3), "nowhere", None, ValueError, "device"),
    ((2, 3), "cpu", [None, None], TypeError, r"generator\[0\] must be a torch.Generator"),
    ((2, 3), "cpu", 7, TypeError, "generator must be a torch.Generator"),
    ((2, 3), "meta", torch.Generator(), ValueError, "generator is on cpu but the op runs on meta"),
])
def test_draw_uniforms_names_a_bad_argument(shape, device, generator, exc, msg):
    with pytest.raises(exc, match=msg):
        domino_ops.draw_uniforms(shape, device, generator)
    assert domino_ops.draw_uniforms(torch.Size([2, 3]), torch.device("cpu"), None).shape == (2, 3)


def _tree_op_cases():
    """(op, its valid arguments by name, the outputs it writes in place) for the four tree
    ops, from each op's own test module."""
    import test_build_tree_kernel_efficient as build
    import test_tree_speculative_sampling_target_only as target_only
    import test_verify_tree_greedy as greedy
    import test_verify_tree_sampling as sampling

    verified = ("predicts", "accept_index", "accept_token_num")
    return [("build_tree_kernel_efficient", build.good_args,
             ("tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling")),
            ("verify_tree_greedy", greedy.good_args, verified),
            ("tree_speculative_sampling_target_only", target_only.good_args, verified),
            ("verify_tree_sampling", sampling.good_args, verified)]


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("op,good_args,outputs", _tree_op_cases(), ids=[c[0] for c in _tree_op_cases()])
def test_tree_ops_refuse_to_overwrite_an_inference_tensor_outside_inference_mode(op, good_args, outputs, backend):
    """The tree ops write their outputs in place: an inference tensor outside
    torch.inference_mode() (which PyTorch refuses to update in place) is refused by name on
    every backend alike (the native kernels used to write it, the reference to fail inside
    PyTorch without naming it); inside inference mode the same call runs."""
    fn = getattr(domino_ops, op)
    for name in outputs:
        args = good_args()
        with torch.inference_mode():
            args[name] = args[name].clone()
        with pytest.raises(ValueError, match=f"{name} is overwritten in place, but is an inference tensor"):
            fn(**args, backend=backend)
    with torch.inference_mode():
        args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in good_args().items()}
        fn(**args, backend=backend)


def test_mixed_devices_meta():
    """Mixed devices are caught before any kernel runs (meta stands in for a GPU here)."""
    with pytest.raises(ValueError, match="w2 is on meta"):
        call_head(w2=torch.randn(50, 4, device="meta"))
    with pytest.raises(ValueError, match="draft_tokens is on meta"):
        domino_ops.verify_greedy(torch.zeros(1, 2, dtype=torch.int64, device="meta"), torch.randn(1, 3, 5))


SAMPLE_CASES = [
    (dict(logits=torch.randn(5)), ValueError, "logits must have 2 dimensions"),
    (dict(logits=torch.randn(2, 5, dtype=torch.float16)), TypeError, "logits must be float32 or bfloat16"),
    (dict(logits=torch.randn(0, 5)), ValueError, "logits must not be empty"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(top_p=-0.5), ValueError, "top_p"),
    (dict(top_k=-3), ValueError, "top_k"),
]


@pytest.mark.parametrize("over,exc,msg", SAMPLE_CASES)
def test_sample_bad_input(over, exc, msg):
    kw = dict(logits=torch.randn(2, 5))
    kw.update(over)
    logits = kw.pop("logits")
    with pytest.raises(exc, match=msg):
        domino_ops.sample(logits, **kw)


def greedy_args():
    return dict(draft_tokens=torch.zeros(2, 3, dtype=torch.int64), target_logits=torch.randn(2, 4, 10))


GREEDY_CASES = [
    (dict(draft_tokens=torch.zeros(2, 3, dtype=torch.int32)), TypeError, "draft_tokens must be int64"),
    (dict(draft_tokens=torch.zeros(6, dtype=torch.int64)), ValueError, "draft_tokens must have 2 dimensions"),
    (dict(draft_tokens=torch.zeros(2, 0, dtype=torch.int64), target_logits=torch.randn(2, 1, 10)), ValueError,
     "draft_tokens must not be empty"),
    (dict(target_logits=torch.randn(2, 3, 10)), ValueError, r"target_logits must have shape \[2, 4, 10\]"),
    (dict(target_logits=torch.randn(3, 4, 10)), ValueError, "target_logits must have shape"),
    (dict(draft_tokens=torch.tensor([[0, 1, 10], [0, 0, 0]])), ValueError, r"draft_tokens must hold token ids in \[0, 10\)"),
    (dict(draft_tokens=torch.tensor([[0, -1, 2], [0, 0, 0]])), ValueError, "draft_tokens must hold token ids"),
    (dict(target_logits=torch.randn(2, 4, 10).long()), TypeError, "target_logits must be float32 or bfloat16"),
]


@pytest.mark.parametrize("over,exc,msg", GREEDY_CASES)
def test_verify_greedy_bad_input(over, exc, msg):
    check_bad_input(domino_ops.verify_greedy, greedy_args(), over, exc, msg)


def sampling_args():
    return dict(draft_tokens=torch.zeros(2, 3, dtype=torch.int64), draft_probs=torch.full((2, 3, 10), 0.1),
                target_probs=torch.full((2, 4, 10), 0.1))


SAMPLING_CASES = [
    (dict(draft_probs=torch.full((2, 3, 9), 0.1)), ValueError, r"draft_probs must have shape \[2, 3, 10\]"),
    (dict(target_probs=torch.full((2, 3, 10), 0.1)), ValueError, r"target_probs must have shape \[2, 4, 10\]"),
    (dict(draft_probs=torch.full((2, 3, 10), 0.1, dtype=torch.bfloat16)), TypeError, "draft_probs must be float32"),
    (dict(target_probs=torch.full((2, 4, 10), 0.1, dtype=torch.float64)), TypeError, "target_probs must be float32"),
    (dict(draft_tokens=torch.full((2, 3), 10)), ValueError, "draft_tokens must hold token ids"),
    (dict(draft_tokens=torch.zeros(2, 3)), TypeError, "draft_tokens must be int64"),
    (dict(generator=3), TypeError, "generator must be a torch.Generator"),
]


@pytest.mark.parametrize("over,exc,msg", SAMPLING_CASES)
def test_verify_sampling_bad_input(over, exc, msg):
    check_bad_input(domino_ops.verify_sampling, sampling_args(), over, exc, msg)


def test_direct_dispatcher_call_is_checked_too():
    """torch.ops callers skip the wrapper; the C++ checks still refuse, naming the argument."""
    out = torch.empty(2, 4, dtype=torch.int64)
    acc = torch.empty(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="target_logits must have shape"):
        torch.ops.domino_ops.verify_greedy(torch.zeros(2, 3, dtype=torch.int64), torch.randn(2, 3, 10), out, acc)
    with pytest.raises(RuntimeError, match="draft_tokens must be in"):
        torch.ops.domino_ops.verify_greedy(torch.full((2, 3), 99), torch.randn(2, 4, 10), out, acc)
    with pytest.raises(RuntimeError, match="out_tokens must be int64"):
        torch.ops.domino_ops.verify_greedy(torch.zeros(2, 3, dtype=torch.int64), torch.randn(2, 4, 10),
                                           torch.empty(2, 3, dtype=torch.int64), acc)
    a = head()
    with pytest.raises(RuntimeError, match="uniforms are required"):
        torch.ops.domino_ops.domino_head_rollout(*a.values(), 1.0, 0, 1.0, None, False, torch.empty(2, 3, dtype=torch.int64),
                                                 torch.empty(2, 3), torch.empty(2, 6))
    with pytest.raises(RuntimeError, match="w2 must have shape"):
        a["w2"] = torch.randn(49, 4)
        torch.ops.domino_ops.domino_head_rollout(*a.values(), 0.0, 0, 1.0, None, False, torch.empty(2, 3, dtype=torch.int64),
                                                 torch.empty(2, 3), torch.empty(2, 6))


@pytest.mark.parametrize("bad", [-0.25, 1.0, float("nan")])
def test_direct_calls_refuse_uniforms_outside_the_unit_interval(bad):
    """The wrappers draw their own uniforms; a torch.ops caller passes them, and a coin
    outside [0, 1) would pick a token of weight 0: each sampling op's C++ checks refuse it,
    naming the argument, before writing anything."""
    def one_bad(shape):
        u = torch.rand(shape, dtype=torch.float64)
        u.view(-1)[-1] = bad
        return u

    must = r"must be in \[0, 1\), got"
    tokens = torch.full((2,), -7, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="uniforms " + must):
        torch.ops.domino_ops.sample(torch.randn(2, 10), 1.0, 0, 1.0, one_bad((2,)), tokens)
    assert (tokens == -7).all()
    a = head()
    with pytest.raises(RuntimeError, match="uniforms " + must):
        torch.ops.domino_ops.domino_head_rollout(*a.values(), 1.0, 0, 1.0, one_bad((2, 3)), False,
                                                 torch.empty(2, 3, dtype=torch.int64), torch.empty(2, 3),
                                                 torch.empty(2, 6))
    draft, q = torch.zeros(2, 3, dtype=torch.int64), torch.full((2, 3, 10), 0.1)
    p, out, acc = torch.full((2, 4, 10), 0.1), torch.full((2, 4), -7, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    for name, ua, ur in (("uniforms_accept", one_bad((2, 3)), torch.rand(2, dtype=torch.float64)),
                         ("uniforms_resample", torch.rand(2, 3, dtype=torch.float64), one_bad((2,)))):
        with pytest.raises(RuntimeError, match=name + " " + must):
            torch.ops.domino_ops.verify_sampling(draft, q, p, ua, ur, out, acc)
    assert (out == -7).all()


@pytest.mark.parametrize("numel", [7, 5000], ids=["short", "long"])
def test_in_range_names_the_argument_and_the_values_found(numel):
    """_checks.in_range reads a short vector through Python and a long one by aminmax: both
    accept values in [lo, hi) and report the range found otherwise."""
    from domino_ops import _checks
    t = torch.arange(numel) % 5
    _checks.in_range("ids", t, 0, 5)
    _checks.in_range("ids", t.view(1, -1) if numel % 2 else t.view(2, -1), 0, 5)
    with pytest.raises(ValueError, match=r"ids must hold values in \[0, 4\), got values in \[0, 4\]"):
        _checks.in_range("ids", t, 0, 4, "hold values")
    t[numel // 2] = -3
    with pytest.raises(ValueError, match=r"ids must be in \[0, 5\), got values in \[-3, 4\]"):
        _checks.in_range("ids", t, 0, 5)


@pytest.mark.parametrize("kw,msg", [
    (dict(rows=-1), "rows must be None or an int >= 0"),
    (dict(rows=2.5), "rows must be None or an int >= 0"),
    (dict(rows=2, device="bogus"), "device must be a torch.device or a device string"),
])
def test_check_sampling_params_checks_rows_and_device(kw, msg):
    with pytest.raises(ValueError, match=msg):
        domino_ops.check_sampling_params(1.0, 0, 1.0, **kw)


def test_numpy_scalars_are_numbers():
    """NumPy scalars pass as the Python numbers they are (they were refused as sampling
    parameters while accepted elsewhere); a NumPy bool does not pass as a number."""
    import numpy as np

    x = torch.randn(3, 9)
    want = domino_ops.sample(x, temperature=0.7, top_k=4, top_p=0.9, generator=torch.Generator().manual_seed(2))
    got = domino_ops.sample(x, temperature=np.float32(0.7), top_k=np.int64(4), top_p=np.float64(0.9),
                            generator=torch.Generator().manual_seed(2))
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="temperature must be a number"):
        domino_ops.sample(x, temperature=np.bool_(True))
    with pytest.raises(TypeError, match="top_k must be an int"):
        domino_ops.sample(x, temperature=1.0, top_k=np.float64(2.0))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_top_k_tensors_are_refused_by_name(dtype):
    """top_k as a uint16/32/64 tensor: refused by name (the range check had raised
    NotImplementedError from a comparison those dtypes lack); uint8 passes."""
    x = torch.randn(2, 6)
    with pytest.raises(TypeError, match=r"top_k as a tensor must have a signed integer dtype \(or uint8\)"):
        domino_ops.sample(x, temperature=1.0, top_k=torch.tensor([3, 2]).to(dtype))
    domino_ops.sample(x, temperature=1.0, top_k=torch.tensor([3, 2], dtype=torch.uint8))


def _grad_cases():
    """(op, call(tensors), tensors by argument name): one valid CPU call per inference op."""
    from kernel_cases import head_rollout_inputs

    g = torch.Generator().manual_seed(0)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    head = dict(zip(("base_logits", "hproj", "state", "gru_input", "w_ih", "w_hh", "w1s", "w2"),
                    head_rollout_inputs(2, 3, 40, 8, 16, 12, torch.float32, torch.float32, True, 0)))
    packed = domino_ops.pack_small_batch_linear_weight(r(5, 8))
    expand = lambda t: domino_ops.domino_head_expand(  # noqa: E731
        t["base_logits"], t["hproj"], t["state"][:1], torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
        t["gru_input"], None, t["w_hh"], t["w1s"], t["w2"], num_children=2)
    return [
        ("small_batch_linear", lambda t: domino_ops.small_batch_linear(t["x"], t["weight"]),
         dict(x=r(3, 8), weight=r(5, 8))),
        ("small_batch_linear_packed", lambda t: domino_ops.small_batch_linear_packed(t["x"], packed),
         dict(x=r(3, 8, dtype=torch.bfloat16))),
        ("small_batch_attention", lambda t: domino_ops.small_batch_attention(t["q"], t["k"], t["v"]),
         dict(q=r(1, 2, 3, 8), k=r(1, 1, 3, 8), v=r(1, 1, 3, 8))),
        ("rms_norm", lambda t: domino_ops.rms_norm(t["input"], t["weight"]), dict(input=r(3, 8), weight=r(8))),
        ("silu_mul", lambda t: domino_ops.silu_mul(t["gate"], t["up"]), dict(gate=r(3, 8), up=r(3, 8))),
        ("apply_rotary_pos_emb", lambda t: domino_ops.apply_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"]),
         dict(q=r(1, 2, 3, 8), k=r(1, 1, 3, 8), cos=r(1, 3, 8), sin=r(1, 3, 8))),
        ("filtered_probs", lambda t: domino_ops.filtered_probs(t["logits"], 1.0), dict(logits=r(2, 10))),
        ("domino_head_rollout", lambda t: domino_ops.domino_head_rollout(*(t[k] for k in head)), dict(head)),
        ("domino_head_expand", expand, dict(head)),
    ]


@pytest.mark.parametrize("op,call,tensors", _grad_cases(), ids=[c[0] for c in _grad_cases()])
def test_inference_ops_refuse_inputs_that_require_grad_in_grad_mode(op, call, tensors):
    """Each op is an inference kernel without a backward: with grad mode on, an input that
    requires grad would silently get no gradient through it (the result used to come back
    untracked), so it is refused naming that input; under no_grad the same call runs."""
    name = next(k for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.is_floating_point())
    tracked = {**tensors, name: tensors[name].clone().requires_grad_()}
    with pytest.raises(RuntimeError, match=rf"{op}: {name} requires grad and grad mode is on"):
        call(tracked)
    with torch.no_grad():
        call(tracked)
    call(tensors)  # nothing requires grad: grad mode on is fine


@pytest.mark.parametrize("temperature", [1e39, 1e300])
def test_direct_calls_refuse_a_temperature_past_float32(temperature):
    """The kernels divide in float32: past its largest value the temperature would be inf
    there, every token tied (the raw ops had returned a uniform distribution, the argmax of
    nothing). The wrappers refused it; each sampling op's C++ check now does too, before
    writing anything. float32's largest value itself is taken."""
    must = r"temperature must be finite and >= 0 \(finite in float32"
    logits = torch.tensor([[0.0, 10.0, 20.0]])
    probs = torch.full((1, 3), -7.0)
    with pytest.raises(RuntimeError, match=must):
        torch.ops.domino_ops.filtered_probs(logits, temperature, 0, 1.0, probs)
    assert (probs == -7).all()
    tokens = torch.full((1,), -7, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=must):
        torch.ops.domino_ops.sample(logits, temperature, 0, 1.0, torch.tensor([0.1], dtype=torch.float64), tokens)
    assert (tokens == -7).all()
    a = head()
    with pytest.raises(RuntimeError, match=must):
        torch.ops.domino_ops.domino_head_rollout(*a.values(), temperature, 0, 1.0, torch.rand(2, 3, dtype=torch.float64),
                                                 False, torch.empty(2, 3, dtype=torch.int64), torch.empty(2, 3),
                                                 torch.empty(2, 6))
    node = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match=must):
        torch.ops.domino_ops.domino_head_expand(
            a["base_logits"], a["hproj"], a["state"], node, torch.zeros(2, dtype=torch.int64), a["gru_input"],
            None, a["w_hh"], a["w1s"], a["w2"], temperature, 0, 1.0, torch.rand(2, 1, dtype=torch.float64),
            torch.empty(2, 1, dtype=torch.int64), torch.empty(2, 1), torch.empty(2, 1, 6), torch.empty(2, 50))
    largest = torch.finfo(torch.float32).max
    torch.ops.domino_ops.filtered_probs(logits, largest, 0, 1.0, probs)
    assert torch.allclose(probs, torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_sampling_parameters_may_be_any_real_numbers(backend):
    """A fractions.Fraction top_p (a numbers.Real, which the checks accept) had broken the
    reference (torch.full refuses it) while the native kernel took it: the wrappers pass
    every number on as Python's float / int, so both give what the floats give."""
    from fractions import Fraction

    import numpy as np

    x = torch.randn(3, 9, generator=torch.Generator().manual_seed(1))
    as_floats = dict(temperature=0.7, top_k=4, top_p=0.9)
    as_others = dict(temperature=Fraction(7, 10), top_k=np.uint8(4), top_p=Fraction(9, 10))
    for kw in (as_floats, as_others):
        kw["got"] = domino_ops.sample(x, **{k: kw[k] for k in ("temperature", "top_k", "top_p")},
                                      generator=torch.Generator().manual_seed(2), backend=backend)
    assert torch.equal(as_others["got"], as_floats["got"])
    want = domino_ops.filtered_probs(x, 0.7, 4, 0.9, backend=backend)
    assert torch.equal(domino_ops.filtered_probs(x, Fraction(7, 10), 4, Fraction(9, 10), backend=backend), want)
    a = head()
    rollout = [domino_ops.domino_head_rollout(*a.values(), temperature=t, top_p=p, backend=backend,
                                              generator=torch.Generator().manual_seed(3))
               for t, p in ((0.7, 0.9), (Fraction(7, 10), Fraction(9, 10)))]
    assert all(torch.equal(u, v) for u, v in zip(*rollout))
    expand = [domino_ops.domino_head_expand(a["base_logits"], a["hproj"], a["state"], torch.tensor([0, 1]),
                                            torch.tensor([0, 2]), a["gru_input"], None, a["w_hh"], a["w1s"], a["w2"],
                                            num_children=2, temperature=t, top_p=p, backend=backend,
                                            generator=torch.Generator().manual_seed(4))
              for t, p in ((0.7, 0.9), (Fraction(7, 10), Fraction(9, 10)))]
    assert all(torch.equal(u, v) for u, v in zip(*expand))


def test_value_reading_ops_refuse_meta_tensors_by_name():
    """The samplers' and tree ops' references read values, which meta tensors lack: the
    wrappers say so (they had failed inside PyTorch, naming no argument); the ops whose
    references only compute still run on meta, and the raw ops have fake kernels."""
    from tree_cases import sgl_verify_args

    must = r"reads its inputs' values, which tensors on the meta device do not have"
    logits = torch.randn(2, 5, device="meta")
    with pytest.raises(ValueError, match="filtered_probs " + must):
        domino_ops.filtered_probs(logits, 0.5)
    with pytest.raises(ValueError, match="sample " + must):
        domino_ops.sample(logits, temperature=0.5, top_k=2)
    draft = torch.zeros(2, 3, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="verify_sampling " + must):
        domino_ops.verify_sampling(draft, torch.rand(2, 3, 5, device="meta"), torch.rand(2, 4, 5, device="meta"))
    args, logits = sgl_verify_args()
    meta = {k: v.to("meta") for k, v in args.items()}
    with pytest.raises(ValueError, match="verify_tree_greedy " + must):
        domino_ops.verify_tree_greedy(**meta, target_predict=logits.argmax(-1).to("meta"))
    on_meta = [None if v is None else v.to("meta") for v in head().values()]
    tokens, logprobs, state = domino_ops.domino_head_rollout(*on_meta)
    assert tokens.device.type == "meta" and tokens.shape == (2, 3)
    # sampling reads values in the head ops' references too
    with pytest.raises(ValueError, match="domino_head_rollout " + must):
        domino_ops.domino_head_rollout(*on_meta, temperature=0.7)
    base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = on_meta
    node = torch.zeros(2, dtype=torch.int64, device="meta")
    children = domino_ops.domino_head_expand(base, hproj, state, node, node, gru_input, w_ih, w_hh, w1s, w2,
                                             num_children=2)
    assert children[0].device.type == "meta" and children[0].shape == (2, 2)
    with pytest.raises(ValueError, match="domino_head_expand " + must):
        domino_ops.domino_head_expand(base, hproj, state, node, node, gru_input, w_ih, w_hh, w1s, w2, num_children=2,
                                      temperature=0.7)


def test_numpy_bools_are_bools():
    """A NumPy bool passes where a bool is asked for (it had been refused as "must be a
    bool, got bool"); an int does not."""
    import numpy as np

    a = head()
    want = domino_ops.domino_head_rollout(*a.values(), write_logits=False)
    got = domino_ops.domino_head_rollout(*a.values(), write_logits=np.bool_(False))
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    with pytest.raises(TypeError, match="write_logits must be a bool, got int"):
        domino_ops.domino_head_rollout(*a.values(), write_logits=0)
    out = domino_ops.domino_head_expand(a["base_logits"], a["hproj"], a["state"], torch.tensor([0, 1]),
                                        torch.tensor([0, 2]), a["gru_input"], None, a["w_hh"], a["w1s"], a["w2"],
                                        num_children=2, write_node_logits=np.bool_(False))
    assert out[3] is None
