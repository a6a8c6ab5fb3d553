"""Training: data shards, packed anchor batches, the loss recipe, resume, and data parallel (torchrun)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import tiny_target
from training.data import load_shards, make_batch
from training.generate_data import (count_tokens, features_path, features_to_rebuild, parse_worker, regenerate,
                                    shard_path, write_shard)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny target saved to disk and three shards of its regenerated data."""
    from domino.config import default_drafter_config

    root = tmp_path_factory.mktemp("tiny")
    target = tiny_target("llama", vocab=64)
    target.save_pretrained(root / "target")
    layer_ids = default_drafter_config(target.config).target_layer_ids
    g = torch.Generator().manual_seed(0)
    data = root / "data"
    data.mkdir()
    for i in range(3):
        prompts = [torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(6)]
        write_shard(shard_path(data, i), regenerate(target, prompts, layer_ids, eos={1}, pad=0, max_new_tokens=24))
    return root, target


def test_shards_hold_greedy_responses_and_features(tiny_run):
    root, target = tiny_run
    convs = load_shards(root / "data")
    assert len(convs) > 10
    tokens, n = count_tokens(root / "data")
    records = [json.loads(line) for f in sorted((root / "data").glob("shard_*.jsonl")) for line in f.open()]
    assert n == 18 and tokens == sum(len(r["response_ids"]) for r in records)
    # conversations too short to hold an anchor (response < 2 tokens) are skipped
    assert len(convs) == sum(len(r["response_ids"]) >= 2 for r in records)
    from domino.config import default_drafter_config
    ids = default_drafter_config(target.config).target_layer_ids
    for c in convs:  # every conversation: generation batches left-padded prompts
        with torch.no_grad():  # responses are the target's greedy continuation
            out = target.generate(c.tokens[None, :c.prompt_len], max_new_tokens=len(c.tokens) - c.prompt_len,
                                  do_sample=False, pad_token_id=0, eos_token_id=[1])
        assert out[0, c.prompt_len:].tolist() == c.tokens[c.prompt_len:].tolist()
        assert c.features.shape == (len(c.tokens) - 1, 4 * 64)  # 4 feature layers x H
        with torch.no_grad():  # features are the hidden states of the tokens fed to the target
            hs = target(c.tokens[None, :-1], output_hidden_states=True).hidden_states
        ref = torch.cat([hs[i + 1] for i in ids], -1)[0]
        torch.testing.assert_close(c.features.float(), ref, atol=0.05, rtol=0.02)


def test_shards_regenerated_together_split_into_each_shards_own(tiny_run):
    """--shards-per-batch: two shards' prompts in one batch, split, give each shard's own
    records and tensors (responses equal; features and log-probabilities up to rounding)."""
    from domino.config import default_drafter_config
    from training.generate_data import split_regenerated

    _, target = tiny_run
    layer_ids = default_drafter_config(target.config).target_layer_ids
    g = torch.Generator().manual_seed(1)
    shards = [[torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)] for n in (3, 5)]
    run = lambda prompts: regenerate(target, prompts, layer_ids, eos={1}, pad=0, max_new_tokens=12)  # noqa: E731
    parts = split_regenerated(run(shards[0] + shards[1]), [3, 5])
    for prompts, part in zip(shards, parts):
        alone = run(prompts)
        assert part.records == alone.records
        assert part.offsets == alone.offsets and part.response_offsets == alone.response_offsets
        torch.testing.assert_close(part.features.float(), alone.features.float(), atol=0.05, rtol=0.02)
        assert torch.equal(part.top_ids[:, 0], alone.top_ids[:, 0])
        torch.testing.assert_close(part.top_logprobs, alone.top_logprobs, atol=2e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="add up"):
        split_regenerated(parts[0], [2])


@pytest.mark.parametrize("temperature", [0.5, 1.3])
def test_sampled_passes_draw_each_token_from_the_target_at_the_temperature(temperature):
    """TemperatureSampler draws from softmax(logits / T); a sampler at temperature 1 (the
    negative control) fails the same test. The -inf entries first and last (tokens of
    probability 0, where an off-by-one of the inverse-CDF search would land) are never
    drawn, from float32 or bf16 logits."""
    from stats import assert_matches_distribution

    from training.generate_data import TemperatureSampler

    logits = torch.tensor([float("-inf"), 2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2, float("-inf")])
    for dtype in (torch.float32, torch.bfloat16):
        rows = logits.to(dtype).expand(20000, -1).clone()
        drawn = TemperatureSampler(temperature, torch.Generator().manual_seed(3)).draw(rows)
        assert drawn.shape == (20000,) and drawn.dtype == torch.int64
        expected = torch.softmax(logits.to(dtype).double() / temperature, 0).numpy()
        assert_matches_distribution(drawn.numpy(), expected)
        with pytest.raises(AssertionError):
            assert_matches_distribution(drawn.numpy(), torch.softmax(logits.to(dtype).double(), 0).numpy())


def test_sampled_responses_are_reproducible_and_store_the_targets_own_logprobs(tiny_run):
    """regenerate(temperature > 0): the same generator seed gives the same responses, other
    text than greedy decoding, and the stored top-k log-probabilities are the target's at
    temperature 1 on the sampled text (equal to a teacher-forced forward's: the recorder saw
    the raw logits, not the sampler's)."""
    from domino.config import default_drafter_config
    from training.generate_data import features_from_ids

    _, target = tiny_run
    layer_ids = default_drafter_config(target.config).target_layer_ids
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(6)]
    run = lambda **kw: regenerate(target, prompts, layer_ids, eos={1}, pad=0, max_new_tokens=16, **kw)  # noqa: E731
    a = run(temperature=0.9, generator=torch.Generator().manual_seed(7))
    b = run(temperature=0.9, generator=torch.Generator().manual_seed(7))
    assert a.records == b.records
    assert a.records != run().records
    forced = features_from_ids(target, a.records, layer_ids, pad=0, top_k=32)
    assert torch.equal(a.top_ids[:, 0], forced.top_ids[:, 0])
    torch.testing.assert_close(a.top_logprobs, forced.top_logprobs, atol=2e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="needs a generator"):
        run(temperature=0.9)


def test_shard_batches_never_mix_passes():
    from training.generate_data import shard_batches

    todo = [1, 2, 3, 4, 5, 7, 8, 9, 12]
    batches = shard_batches(todo, n_shards=5, per_batch=3)
    assert batches == [[1, 2, 3], [4], [5, 7, 8], [9], [12]]
    assert shard_batches(todo, 5, 1) == [[i] for i in todo]


def test_draft_hidden_is_the_contiguous_draft_positions():
    from domino.config import default_drafter_config
    from domino.model import DominoDraftModel

    target = tiny_target("llama", vocab=64)
    model = DominoDraftModel(default_drafter_config(target.config)).bind_target(target)
    h = torch.randn(3, 5, model.config.block_size, 7)
    first = 0 if model.config.shift_label else 1
    for n, want in ((None, h[..., first:, :]), (2, h[..., first:first + 2, :])):
        got = model.draft_hidden(h, n)
        assert got.is_contiguous() and torch.equal(got, want)


def test_feature_rebuilds_are_split_evenly_between_workers(tmp_path):
    """Shards lacking features are dealt out by rank, so the workers' shares are disjoint,
    cover every such shard, and differ in size by at most one, even when all of them have
    even indices (by index, worker 0 of 2 would get them all)."""
    for i in range(12):
        shard_path(tmp_path, i).write_text("")
        if i % 2 or i >= 10:  # odd shards and 10, 11 have their features
            features_path(shard_path(tmp_path, i)).write_bytes(b"")
    lacking = {shard_path(tmp_path, i) for i in (0, 2, 4, 6, 8)}
    shares = [features_to_rebuild(tmp_path, w, 2) for w in range(2)]
    assert set(shares[0]) | set(shares[1]) == lacking and not set(shares[0]) & set(shares[1])
    assert sorted(len(s) for s in shares) == [2, 3]
    assert features_to_rebuild(tmp_path, 0, 1) == sorted(lacking)
    assert features_to_rebuild(tmp_path, 0, 1, (4, 9)) == [shard_path(tmp_path, i) for i in (4, 6, 8)]


def test_a_shard_being_rebuilt_is_claimed_by_one_worker_and_freed_by_its_death(tmp_path):
    """A second claim on a held shard fails (a worker that listed it too skips it); the claim
    is gone after the rebuild, and a killed holder leaves it free."""
    from training.generate_data import rebuild_claim

    shard = shard_path(tmp_path, 3)
    shard.write_text("")
    with rebuild_claim(shard) as first:
        with rebuild_claim(shard) as second:
            assert first and not second
    assert not list(tmp_path.glob("*.claim"))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from training.generate_data import rebuild_claim\n"
                               "with rebuild_claim(Path(sys.argv[1])) as mine:\n print(mine, flush=True); time.sleep(60)",
                               str(shard)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        with rebuild_claim(shard) as mine:
            assert not mine
    finally:
        holder.kill()
        holder.wait()
    with rebuild_claim(shard) as mine:
        assert mine


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "1/0"])
def test_generate_data_worker_rejects_bad_splits(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="--worker"):
        parse_worker(text)
    assert parse_worker("1/3") == (1, 3)


@pytest.mark.parametrize("flag, value", [("--batch-size", "0"), ("--max-new-tokens", "0"), ("--top-k", "0"),
                                         ("--shards-per-batch", "0"), ("--target-tokens", "-1"), ("--passes", "0"),
                                         ("--sample-temperature", "0"), ("--sample-temperature", "nan"),
                                         ("--shard-range", "5 5"), ("--threads", "0"), ("--threads", "-1")])
def test_generate_data_refuses_bad_settings_before_writing_anything(tmp_path, monkeypatch, capsys, flag, value):
    """Checked before the target loads and before dataset.json records the settings (a bad
    value used to crash later and stay recorded, refusing the corrected rerun)."""
    from training.generate_data import main

    monkeypatch.setattr(sys, "argv", ["generate_data", "--out", str(tmp_path / "d"), flag, *value.split()])
    with pytest.raises(SystemExit):
        main()
    assert f"{flag} must be" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_packed_batch_masks_context_strictly_before_anchor(tiny_run):
    root, _ = tiny_run
    convs = load_shards(root / "data")[:3]
    B, n = 8, 7
    batch = make_batch(convs, 3, B, n, 63, torch.Generator().manual_seed(0))
    N, A = 3, 3
    Tc = batch.features.shape[1]
    for s in range(N):
        for a in range(A):
            p = int(batch.block_pos[s, a * B])
            assert batch.anchors[s, a] == convs[s].tokens[p]
            for j in range(B):
                q = a * B + j
                ctx = batch.attn_mask[s, q, :Tc]
                assert ctx[:p].all() and not ctx[p:].any()
                blk = batch.attn_mask[s, q, Tc:].view(A, B)
                assert blk[a].all() and blk.sum() == B
            for k in range(n):
                if batch.label_valid[s, a, k]:
                    assert batch.labels[s, a, k] == convs[s].tokens[p + 1 + k]
                    assert batch.teacher[s, a, k] == convs[s].tokens[p + k]


@pytest.fixture(scope="module")
def sampled_run(tiny_run, tmp_path_factory):
    """The tiny target's responses sampled at T = 0.9 (two shards): the labels the data
    holds are often not the target's greedy choice."""
    _, target = tiny_run
    from domino.config import default_drafter_config

    root = tmp_path_factory.mktemp("sampled")
    (root / "target").symlink_to(tiny_run[0] / "target")
    layer_ids = default_drafter_config(target.config).target_layer_ids
    g = torch.Generator().manual_seed(11)
    (root / "data").mkdir()
    for i in range(2):
        prompts = [torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(6)]
        write_shard(shard_path(root / "data", i), regenerate(target, prompts, layer_ids, eos={1}, pad=0,
                                                             max_new_tokens=24, temperature=0.9, generator=g))
    return root, target


def test_target_argmax_labels_are_the_targets_greedy_choice_at_each_position(tiny_run, sampled_run):
    """Each valid label becomes the target's top-1 token for that position (its stored top-K
    on the sampled prefix); invalid ones, the anchors and the teacher-forced inputs stay. On
    greedy data the labels already are the target's choice, so nothing changes."""
    from training.data import with_target_argmax_labels

    convs = load_shards(sampled_run[0] / "data")
    batch = make_batch(convs[:6], 4, 8, 7, 63, torch.Generator().manual_seed(0))
    new = with_target_argmax_labels(batch)
    changed = 0
    for s, c in enumerate(convs[:6]):
        for a in range(4):
            p = int(batch.block_pos[s, a * 8])
            for k in range(7):
                if batch.label_valid[s, a, k]:
                    r = p + 1 + k - c.prompt_len  # the label's response index
                    assert new.labels[s, a, k] == c.top_ids[r, 0]
                    changed += int(new.labels[s, a, k] != batch.labels[s, a, k])
                else:
                    assert new.labels[s, a, k] == batch.labels[s, a, k]
    assert changed > 0  # sampled text: some next tokens are not the greedy choice
    assert torch.equal(new.teacher, batch.teacher) and torch.equal(new.anchors, batch.anchors)
    greedy = make_batch(load_shards(tiny_run[0] / "data")[:6], 4, 8, 7, 63, torch.Generator().manual_seed(0))
    assert torch.equal(with_target_argmax_labels(greedy).labels, greedy.labels)


def test_training_on_target_argmax_labels_trains_on_other_labels(sampled_run, tmp_path):
    """``--labels target_argmax`` reaches the loss: on sampled data its losses differ from
    the default's (same seed and batches)."""
    root, _ = sampled_run
    written = {t for c in load_shards(root / "data") for t in c.tokens[c.prompt_len:].tolist()}
    mask = ["--mask-token-id", str(max(set(range(2, 64)) - written))]  # one the sampler never wrote
    default = run_train(root, tmp_path / "tokens", "--steps", "2", *mask)
    argmax = run_train(root, tmp_path / "argmax", "--steps", "2", "--labels", "target_argmax", *mask)
    assert [r["loss_final"] for r in default] != [r["loss_final"] for r in argmax]


def run_train(root, out, *extra, nproc=None, env=None):
    """The trainer on the tiny run's data, in this process (a fresh interpreter per run cost
    ~5 s of imports), or as ``nproc`` data-parallel processes under torchrun; its log."""
    # a new drafter's shape (a saved one, --init-from, brings its own)
    shape = [] if "--init-from" in extra else ["--layers", "1", "--rank", "8", "--gru", "16", "--mask-token-id", "63"]
    args = ["--data", str(root / "data"), "--out", str(out), "--target", str(root / "target"), *shape,
            "--block-size", "8", "--seqs-per-step", "4", "--anchors", "2",
            "--eval-shards", "0", "--eval-every", "3", "--ckpt-every", "1", *extra]
    if nproc:
        # --standalone: a free rendezvous port each run (a fixed one failed the test once
        # when the port was still taken)
        # each rank checks the process group is torn down after training (tests/train_rank.py)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(REPO / "tests" / "train_rank.py"), *args]
        # a rank that aborts prints every thread's Python stack (faulthandler)
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",
               **(env or {})}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (f"torchrun failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                                      f"{proc.stderr[-6000:]}")

    else:
        from training.train import main

        main(args)
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_loss_goes_down_and_curriculum_moves(tiny_run, tmp_path):
    root, _ = tiny_run
    log = run_train(root, tmp_path / "run", "--steps", "6", "--lr", "3e-3")
    assert [r["lam"] for r in log] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.0])
    assert log[-1]["loss_base"] < log[0]["loss_base"]
    assert "tau_head_on" in log[2] and "tau_head_off" in log[2]
    assert [r["train_tokens"] for r in log] == [(s + 1) * 4 * 2 * 7 for s in range(6)]  # seqs x anchors x drafts
    assert (tmp_path / "run" / "drafter" / "config.json").exists()
    # the acceptance curve over the run's evaluations (steps 2 and 5)
    png = tmp_path / "curve.png"
    out = subprocess.run([sys.executable, "benchmarks/eval_acceptance.py", "curve", str(tmp_path / "run"),
                          "--out", str(png)], cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    assert png.stat().st_size > 0 and len(out.stdout.splitlines()) == 4  # header, 2 evaluations, plot path


def test_lineage_plot_counts_the_shipped_stages_steps(tmp_path):
    """The stages' plot reads each stage's log; through stage 28 the lineage saw 50,075
    steps (README), each 1,920 draft positions."""
    records = json.loads((REPO / "benchmarks/results/drafter_lineage.json").read_text())
    png = tmp_path / "stages.png"
    out = subprocess.run([sys.executable, "benchmarks/eval_acceptance.py", "lineage", "--out", str(png)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    rows = {int(line.split("|")[0]): int(line.split("|")[2]) for line in out.stdout.splitlines()[1:-1]}
    assert sorted(rows) == [r["stage"] for r in records["stages"]] and png.stat().st_size > 0
    assert rows[28] == 50_075 * 1920


def test_resume_continues_with_the_same_data_order(tiny_run, tmp_path):
    root, _ = tiny_run
    straight = run_train(root, tmp_path / "a", "--steps", "4")
    run_train(root, tmp_path / "b", "--steps", "4", "--stop-after", "2")  # "killed" after step 1
    resumed = run_train(root, tmp_path / "b", "--steps", "4")  # log.jsonl accumulates
    assert [r["step"] for r in resumed] == [0, 1, 2, 3] and len(straight) == 4
    for x, y in zip(straight, resumed):
        assert x["loss_final"] == pytest.approx(y["loss_final"], rel=1e-5)


@pytest.mark.parametrize("flags", [[], ["--position-weights", "acceptance"]])
def test_two_processes_match_one_on_the_same_global_batch(tiny_run, tmp_path, flags):
    """Data parallel is the one-process step: the loss's normaliser (and the acceptance
    weights' scale) over the global batch, not each rank's share."""
    root, _ = tiny_run
    one = run_train(root, tmp_path / "one", "--steps", "3", *flags)
    two = run_train(root, tmp_path / "two", "--steps", "3", *flags, nproc=2)
    assert len(one) == len(two) == 3
    for x, y in zip(one, two):
        assert x["loss_final"] == pytest.approx(y["loss_final"], rel=1e-4)
        assert x["loss_base"] == pytest.approx(y["loss_base"], rel=1e-4)


def test_train_shards_chooses_the_training_data(tiny_run, tmp_path, capsys):
    """--train-shards trains on the named shards only (a machine with some shards'
    features rebuilt trains on those); a shard not on disk is refused by name."""
    root, _ = tiny_run
    shard_2 = len(load_shards(root / "data", [2]))
    run_train(root, tmp_path / "run", "--steps", "1", "--eval-every", "100", "--train-shards", "2")
    assert f"train: {shard_2} conversations" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--train-shards: no shard \[7\]"):
        run_train(root, tmp_path / "bad", "--steps", "1", "--train-shards", "1", "7")


@pytest.mark.parametrize("flags", [["--ttt"], ["--no-curriculum"], ["--loss", "kl"], ["--loss", "ce_tv"], ["--bf16"],
                                   ["--bf16", "auto"], ["--position-weights", "acceptance"]])
def test_ablation_switches_run(tiny_run, default_log, tmp_path, flags):
    """Each switch trains, and changes the training: its losses differ from the default
    run's (same seed and data); ``--bf16 auto`` is ``--bf16`` where bf16 matmuls are fast
    (this CPU's AVX512-BF16, a GPU) and the default elsewhere."""
    from training.train import fast_bf16

    root, _ = tiny_run
    log = run_train(root, tmp_path / "run", "--steps", "2", *flags)
    assert len(log) == len(default_log) == 2 and all(r["loss_final"] > 0 for r in log)
    if flags[0] == "--no-curriculum":
        assert all(r["lam"] == 0.0 for r in log)

    def losses(entries):
        return [(r["loss_base"], r["loss_final"]) for r in entries]

    if flags == ["--bf16", "auto"]:
        on = run_train(root, tmp_path / "on", "--steps", "2", "--bf16") if fast_bf16(torch.device("cpu")) else None
        assert losses(log) == losses(on if on is not None else default_log)
    else:
        assert losses(log) != losses(default_log)


@pytest.mark.parametrize("sub", ["tau", "ablation run"])
@pytest.mark.parametrize("flag", ["--num-prompts", "--max-new-tokens"])
def test_eval_acceptance_refuses_counts_below_one(sub, flag):
    """0 prompts divided by zero; a negative count sliced the prompt list from the end."""
    out = subprocess.run([sys.executable, "benchmarks/eval_acceptance.py", *sub.split(), flag, "-1"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and f"{flag} must be >= 1, got -1" in out.stderr


def test_ablation_table_takes_runs_without_held_out_evaluations():
    """Runs trained with --eval-convs 0 log no held-out tau (the ablation crashed on them)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from eval_acceptance import last_held_out_tau
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    log = [{"step": 0, "loss_base": 1.0}, {"step": 1, "tau_head_on": 2.5, "tau_head_off": 2.0}, {"step": 2}]
    assert last_held_out_tau(log) == "2.500 / 2.000"
    assert last_held_out_tau([{"step": 0}, {"step": 1}]) == "-"


@pytest.fixture(scope="module")
def default_log(tiny_run, tmp_path_factory):
    """Two steps of the default training on the tiny run (what each ablation switch changes)."""
    root, _ = tiny_run
    return run_train(root, tmp_path_factory.mktemp("default"), "--steps", "2")


def test_export_checkpoint_writes_the_running_jobs_weights(tiny_run, tmp_path):
    """A checkpoint exported mid-run holds exactly its weights, under the base drafter's
    config and draft vocabulary, and no stale calibration; another config is refused."""
    from domino.budget import Calibration
    from domino.model import DominoDraftModel
    from training.export_checkpoint import export_checkpoint

    root, _ = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")  # a drafter to continue from
    base = DominoDraftModel.from_pretrained(tmp_path / "first" / "drafter").set_draft_vocab(torch.arange(3, 40))
    base.calibration = Calibration(edges=[0.5, 1.0], rates=[0.2, 0.7])
    base.save_pretrained(tmp_path / "base", dtype=torch.float32)
    run_train(root, tmp_path / "run", "--init-from", str(tmp_path / "base"), "--steps", "5", "--stop-after", "3",
              "--eval-every", "100")
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "out", base=tmp_path / "base",
                             dtype=torch.float32) == 2
    out = DominoDraftModel.from_pretrained(tmp_path / "out")
    for name, w in out.state_dict().items():
        assert torch.equal(w, state["model"][name]), name
    assert not torch.equal(out.fc.weight, base.fc.weight)  # trained on, not the base's weights
    assert torch.equal(out.draft_vocab, torch.arange(3, 40))
    assert out.calibration.edges == []
    # without --base: the checkpoint's own config and vocabulary (a run from scratch too)
    export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "out_nobase", dtype=torch.float32)
    alone = DominoDraftModel.from_pretrained(tmp_path / "out_nobase")
    assert torch.equal(alone.draft_vocab, torch.arange(3, 40)) and torch.equal(alone.fc.weight, out.fc.weight)
    export_checkpoint(tmp_path / "first" / "checkpoint.pt", tmp_path / "out_first", dtype=torch.float32)
    first = DominoDraftModel.from_pretrained(tmp_path / "out_first")
    first_state = torch.load(tmp_path / "first" / "checkpoint.pt", weights_only=False)["model"]
    assert first.draft_vocab is None and torch.equal(first.fc.weight, first_state["fc.weight"])
    other = tmp_path / "other"
    run_train(root, other, "--steps", "1", "--eval-every", "100", "--rank", "4")
    with pytest.raises(ValueError, match="another config"):
        export_checkpoint(other / "checkpoint.pt", tmp_path / "out2", base=tmp_path / "base")


def test_draft_vocab_size_gives_a_new_drafter_the_most_frequent_tokens(tiny_run, tmp_path, capsys):
    """--draft-vocab-size K: a new drafter drafts from the K most frequent response tokens of
    its training shards, trains over them, keeps them on resume and saves them."""
    from domino.model import DominoDraftModel
    from training.draft_vocab import most_frequent, response_counts

    root, _ = tiny_run
    log = run_train(root, tmp_path / "run", "--steps", "3", "--stop-after", "2", "--draft-vocab-size", "20",
                    "--eval-every", "100")
    log += run_train(root, tmp_path / "run", "--steps", "3", "--draft-vocab-size", "20", "--eval-every", "100")
    assert [r["step"] for r in log] == [0, 1, 0, 1, 2]  # the second run resumed at step 2 (its log holds both)
    counts, _ = response_counts(root / "data", {0})
    saved = DominoDraftModel.from_pretrained(tmp_path / "run" / "drafter")
    assert torch.equal(saved.draft_vocab, most_frequent(counts, 20))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_train(root, tmp_path / "bad", "--steps", "1", "--draft-vocab-size", "-1")
    assert "--draft-vocab-size must be >= 0" in capsys.readouterr().err  # argparse's error


def test_init_from_trains_on_at_another_block_size(tiny_run, tmp_path):
    """--init-from keeps the saved drafter's block size unless --block-size is given: no
    weight depends on it, so a drafter continues at a shorter block with its own weights."""
    from domino.model import DominoDraftModel

    root, _ = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")  # block 8 (run_train's)
    log = run_train(root, tmp_path / "short", "--init-from", str(tmp_path / "first" / "drafter"), "--block-size", "4",
                    "--steps", "2", "--eval-every", "100")
    out = DominoDraftModel.from_pretrained(tmp_path / "short" / "drafter")
    assert out.config.block_size == 4 and out.config.num_drafts == 3
    assert [r["train_tokens"] for r in log] == [(s + 1) * 4 * 2 * 3 for s in range(2)]  # seqs x anchors x 3 drafts
    first = DominoDraftModel.from_pretrained(tmp_path / "first" / "drafter")
    assert first.config.block_size == 8 and set(out.state_dict()) == set(first.state_dict())


def test_a_grown_drafter_trains_its_new_layer(tiny_run, tmp_path):
    """--init-from a drafter grown by training.grow_layers: the run keeps its depth, and its
    new layer, which starts as the identity, is trained (its zeroed projections move)."""
    from domino.model import DominoDraftModel
    from training.grow_layers import main as grow

    root, _ = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")
    grow([str(tmp_path / "first" / "drafter"), str(tmp_path / "grown")])
    run_train(root, tmp_path / "run", "--init-from", str(tmp_path / "grown"), "--steps", "3", "--eval-every", "100")
    out = DominoDraftModel.from_pretrained(tmp_path / "run" / "drafter")
    assert out.config.num_hidden_layers == len(out.layers) == 2
    assert out.layers[1].self_attn.o_proj.weight.any() and out.layers[1].mlp.down_proj.weight.any()


def test_a_drafter_with_a_grown_head_trains_its_new_weights(tiny_run, tmp_path):
    """--init-from a drafter grown by training.grow_head (rank and GRU width): the run keeps
    its sizes, and the new weights that start at zero (W2's new columns, W1's columns for the
    new GRU units) are trained, and so are the random ones behind them."""
    from domino.model import DominoDraftModel
    from training.grow_head import main as grow

    root, _ = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")
    c = DominoDraftModel.from_pretrained(tmp_path / "first" / "drafter").config
    r, g, H = c.emb_dim, c.gru_hidden_dim, c.hidden_size
    grow([str(tmp_path / "first" / "drafter"), str(tmp_path / "grown"), "--rank", str(r + 4), "--gru", str(g + 4)])
    grown = DominoDraftModel.from_pretrained(tmp_path / "grown")
    run_train(root, tmp_path / "run", "--init-from", str(tmp_path / "grown"), "--steps", "3", "--eval-every", "100")
    out = DominoDraftModel.from_pretrained(tmp_path / "run" / "drafter")
    assert (out.config.emb_dim, out.config.gru_hidden_dim) == (r + 4, g + 4)
    assert not grown.embed_proj[2].weight[:, r:].any() and out.embed_proj[2].weight[:, r:].any()
    assert not grown.embed_proj[0].weight[:r, H + g:].any() and out.embed_proj[0].weight[:r, H + g:].any()
    assert not torch.equal(out.embed_proj[0].weight[r:], grown.embed_proj[0].weight[r:])
    for gate in range(3):  # the old units' columns for the new ones: zero, then trained
        block = slice(gate * (g + 4), gate * (g + 4) + g)
        assert not grown.prefix_gru.weight_hh_l0[block, g:].any() and out.prefix_gru.weight_hh_l0[block, g:].any()


def test_a_drafter_continued_from_a_saved_one_is_built_in_training_mode(tiny_run, tmp_path):
    """from_pretrained returns eval mode; --init-from must still train in training mode (on a
    GPU, cuDNN refuses the GRU's backward otherwise; on a CPU nothing showed it)."""
    from training.train import build_model, parse_args

    root, target = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")
    args = parse_args(["--data", str(root / "data"), "--out", str(tmp_path / "next"), "--target", str(root / "target"),
                       "--init-from", str(tmp_path / "first" / "drafter")])
    model = build_model(args, target)
    assert all(m.training for m in model.modules())


def test_resuming_with_other_run_arguments_is_refused(tiny_run, tmp_path):
    """A checkpoint resumes only under the arguments that made it (new shards may join)."""
    root, _ = tiny_run
    run_train(root, tmp_path / "run", "--steps", "4", "--stop-after", "2", "--eval-every", "100")
    for flags, name in ((["--loss", "kl"], "--loss 'ce'"), (["--lr", "1e-3"], "--lr 0.0006"),
                        (["--mask-token-id", "62"], "--mask-token-id 63"),
                        (["--layers", "3"], "--layers 1"), (["--rank", "32"], "--rank 8")):
        with pytest.raises(SystemExit, match=f"is another run's: it was made with {name}"):
            run_train(root, tmp_path / "run", "--steps", "4", "--eval-every", "100", *flags)
    log = run_train(root, tmp_path / "run", "--steps", "4", "--eval-every", "100", "--train-shards", "1", "2")
    assert log[-1]["step"] == 3


def test_a_run_saved_before_a_run_argument_existed_had_its_default():
    """A checkpoint saved before --position-weights existed was a decay run: resuming it
    with the default passes, with acceptance weights is refused by name."""
    from training.train import check_same_run, parse_args

    saved = vars(parse_args(["--data", "d", "--out", "o"]))
    del saved["position_weights"]
    check_same_run(saved, parse_args(["--data", "d", "--out", "o"]), Path("ckpt"))
    with pytest.raises(SystemExit, match="--position-weights 'decay' \\(now 'acceptance'\\)"):
        check_same_run(saved, parse_args(["--data", "d", "--out", "o", "--position-weights", "acceptance"]),
                       Path("ckpt"))


def test_a_run_resumes_with_its_paths_spelled_another_way(tmp_path, monkeypatch):
    """--target, --config and --init-from name paths: the same directory given relative or
    absolute, or through a symlink, resumes the run; another directory is refused by name."""
    from training.train import check_same_run, parse_args

    for d in ("target", "other"):
        (tmp_path / d).mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    monkeypatch.chdir(tmp_path)
    saved = vars(parse_args(["--data", "d", "--out", "o", "--target", "target", "--init-from", "target"]))
    for spelling in ("target", "./target", str(tmp_path / "target"), "link", "other/../target"):
        check_same_run(saved, parse_args(["--data", "d", "--out", "o", "--target", spelling, "--init-from", spelling]),
                       Path("ckpt"))
    with pytest.raises(SystemExit, match="--target 'target' \\(now 'other'\\)"):
        check_same_run(saved, parse_args(["--data", "d", "--out", "o", "--target", "other", "--init-from", "target"]),
                       Path("ckpt"))


@pytest.mark.parametrize("extra, msg", [
    (["--init-from", "somewhere", "--layers", "3"], "--init-from takes the saved drafter's config and weights: drop --layers"),
    (["--config", "somewhere", "--block-size", "4"], "--config gives the drafter's shape: drop --block-size"),
    (["--target", "t"], "--mask-token-id: a new drafter for --target needs a mask token"),
    (["--eval-every", "0"], "--eval-every must be >= 1"),
    (["--export-dtype", "bf16"], "invalid choice"),
    (["--gamma", "0"], "--gamma must be > 0"),
    (["--position-weights", "acceptance", "--ttt"], "--position-weights acceptance reads teacher-forced"),
    (["--layers", "0", "--mask-token-id", "1"], "--layers must be >= 1"),
    (["--block-size", "1"], "--block-size must be >= 2"),
    (["--max-shards", "0"], "--max-shards must be >= 1"),
    (["--clip=-1"], "--clip must be a finite number > 0"),  # flipped gradients: training climbed the loss
    (["--clip", "0"], "--clip must be a finite number > 0"),
    (["--lr", "nan"], "--lr must be a finite number > 0"),
    (["--warmup", "5"], "--warmup must be a fraction of the steps in [0, 1]"),
    (["--warmup", "nan"], "--warmup must be a fraction of the steps in [0, 1]"),
    (["--eval-convs", "-3"], "--eval-convs must be >= 0"),  # held[:-3]
    (["--eval-generator-prompts", "-1"], "--eval-generator-prompts must be >= 0"),
    (["--eval-max-new-tokens", "0"], "--eval-max-new-tokens must be >= 1"),
    (["--stop-after=-1"], "--stop-after must be >= 1"),
])
def test_arguments_that_would_be_ignored_or_crash_late_are_refused(capsys, extra, msg):
    from training.train import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--out", "o", *extra])
    assert msg in capsys.readouterr().err


def test_a_resumed_run_logs_each_step_once(tiny_run, tmp_path):
    """Killed between checkpoints: the steps after the last one are run and logged again,
    and the log keeps one line per step."""
    root, _ = tiny_run
    run_train(root, tmp_path / "run", "--steps", "4", "--ckpt-every", "2", "--stop-after", "3")  # ckpt at step 1
    log = run_train(root, tmp_path / "run", "--steps", "4", "--ckpt-every", "2")
    assert [r["step"] for r in log] == [0, 1, 2, 3]


def test_a_run_killed_before_its_first_checkpoint_logs_each_step_once(tiny_run, tmp_path):
    """No checkpoint to resume from: the run starts over, and the old log's steps go."""
    root, _ = tiny_run
    run_train(root, tmp_path / "run", "--steps", "4", "--ckpt-every", "4", "--stop-after", "2")
    log = run_train(root, tmp_path / "run", "--steps", "4", "--ckpt-every", "4")
    assert [r["step"] for r in log] == [0, 1, 2, 3]


def test_a_step_without_a_valid_label_leaves_the_drafter_finite(tiny_run, tmp_path):
    """A draft vocabulary of one token: most steps hold no label inside it, so their
    normaliser is 0; the loss is 0 there, not 0 / 0, whose NaN gradients AdamW wrote into
    every weight."""
    from domino.model import DominoDraftModel

    root, _ = tiny_run
    log = run_train(root, tmp_path / "run", "--steps", "3", "--seqs-per-step", "1", "--anchors", "1",
                    "--draft-vocab-size", "1", "--eval-every", "100")
    assert all(r["loss_final"] == r["loss_final"] for r in log)  # no NaN
    drafter = DominoDraftModel.from_pretrained(tmp_path / "run" / "drafter")
    assert all(torch.isfinite(p).all() for p in drafter.parameters())


def test_data_the_trainer_cannot_use_is_refused_by_name(tiny_run, tmp_path):
    """Token shards without features (a fresh clone's), data another target made, and a
    directory that does not exist: each refused before training, saying what to do."""
    import shutil

    root, _ = tiny_run
    bare = tmp_path / "bare"
    shutil.copytree(root / "data", bare)
    (bare / "shard_00001.features.safetensors").unlink()
    with pytest.raises(SystemExit, match=r"--data: shard_00001.jsonl has no features .*--target-tokens 0"):
        run_train(root, tmp_path / "r1", "--steps", "1", "--data", str(bare))
    other = tmp_path / "other"
    shutil.copytree(root / "data", other)
    (other / "dataset.json").write_text(json.dumps({"target": {"model_type": "llama", "hidden_size": 4096}}))
    with pytest.raises(SystemExit, match=r"--target: .* was generated by another target \(hidden_size 4096 there"):
        run_train(root, tmp_path / "r2", "--steps", "1", "--data", str(other))
    written = next(int(t) for c in load_shards(root / "data", [1, 2]) for t in c.tokens[c.prompt_len:])
    shape = ["--layers", "1", "--rank", "8", "--gru", "16"]
    with pytest.raises(SystemExit, match=rf"--mask-token-id: the target writes token {written}"):
        run_train(root, tmp_path / "r4", "--steps", "1", "--mask-token-id", str(written), *shape)
    with pytest.raises(SystemExit, match="--data: no directory"):
        run_train(root, tmp_path / "r3", "--steps", "1", "--data", str(tmp_path / "nowhere"))


def test_features_computed_by_the_target_are_the_stored_ones(tiny_run):
    """--target-features computed: each step's conversations get from one teacher-forced
    forward what the feature files hold (up to rounding), in the conversations' order."""
    from domino.config import default_drafter_config
    from training.train import with_computed_features

    root, target = tiny_run
    stored = load_shards(root / "data")
    bare = load_shards(root / "data", features=False)
    assert [c.tokens.tolist() for c in bare] == [c.tokens.tolist() for c in stored]
    assert all(c.features is None and c.top_ids is None for c in bare)
    ids = default_drafter_config(target.config).target_layer_ids
    order = [5, 0, 3, 3, 1]  # a step draws with replacement, in any order
    computed = with_computed_features(target, [bare[i] for i in order], ids, top_k=32)
    for c, i in zip(computed, order):
        torch.testing.assert_close(c.features.float(), stored[i].features.float(), atol=0.05, rtol=0.02)
        assert (c.top_ids == stored[i].top_ids).float().mean() > 0.95  # near-ties may swap under rounding
        torch.testing.assert_close(c.top_logprobs.float(), stored[i].top_logprobs.float(), atol=0.02, rtol=0.01)


def test_training_on_computed_features_needs_no_feature_files(tiny_run, tmp_path):
    """Token shards alone (a fresh clone's) train with --target-features computed, and the
    losses are those of the stored features (same batches; features equal up to rounding)."""
    import shutil

    root, _ = tiny_run
    bare = tmp_path / "bare"
    shutil.copytree(root / "data", bare)
    for f in bare.glob("*.features.safetensors"):
        f.unlink()
    flags = ["--steps", "3", "--labels", "target_argmax"]
    stored = run_train(root, tmp_path / "stored", *flags)
    computed = run_train(root, tmp_path / "computed", *flags, "--data", str(bare), "--target-features", "computed")
    # the same bits here (the bf16 features round alike); halving the computed features moved
    # the losses by ~5e-5 relative, so 1e-5 leaves room only for a rare rounding difference
    for a, b in zip(stored, computed, strict=True):
        assert b["loss_final"] == pytest.approx(a["loss_final"], rel=1e-5)
        assert b["loss_base"] == pytest.approx(a["loss_base"], rel=1e-5)
    assert computed[2]["tau_head_on"] == pytest.approx(stored[2]["tau_head_on"], rel=0.1)
    assert len(run_train(root, tmp_path / "no_eval", "--steps", "1", "--eval-convs", "0", "--data", str(bare),
                         "--target-features", "computed")) == 1


@pytest.mark.parametrize("flags", [["--loss", "kl"], ["--labels", "target_argmax"]])
def test_options_that_read_the_stored_top_k_refuse_shards_without_it(tiny_run, tmp_path, flags):
    """Features made before the top-k was stored (no "top_ids"): the options that read it
    are refused by name, saying what to use instead; the default trains."""
    import shutil

    from safetensors.torch import load_file, save_file

    root, _ = tiny_run
    old = tmp_path / "old"
    shutil.copytree(root / "data", old)
    for f in old.glob("*.features.safetensors"):
        t = load_file(f)
        save_file({k: v for k, v in t.items() if k not in ("top_ids", "top_logprobs", "response_offsets")}, f)
    instead = {"--loss": "--loss ce", "--labels": "--labels tokens"}[flags[0]]
    with pytest.raises(SystemExit, match=rf"{' '.join(flags)}: needs the target's stored top-k.* or use {instead}"):
        run_train(root, tmp_path / "refused", "--steps", "1", "--data", str(old), *flags)
    assert len(run_train(root, tmp_path / "default", "--steps", "1", "--data", str(old))) == 1


def test_no_training_shard_left_is_refused_by_name(tiny_run, tmp_path):
    root, _ = tiny_run
    with pytest.raises(SystemExit, match="no training data"):
        run_train(root, tmp_path / "run", "--steps", "1", "--eval-shards", "0", "1", "2")


def test_shards_holding_the_held_out_prompts_are_not_trained_on(tiny_run, tmp_path, capsys):
    """A later pass over the prompt order (generate_data --passes) holds the held-out shard's
    prompts again: named when asked for, left out of the default selection."""
    import shutil

    root, _ = tiny_run
    data = tmp_path / "root" / "data"
    shutil.copytree(root / "data", data)
    (tmp_path / "root" / "target").symlink_to(root / "target")
    for suffix in (".jsonl", ".features.safetensors"):  # shard 3: shard 0's prompts again
        shutil.copy(data / f"shard_00000{suffix}", data / f"shard_00003{suffix}")
    with pytest.raises(SystemExit, match=r"--train-shards: shards \[3\] hold prompts of the held-out shards \[0\]"):
        run_train(tmp_path / "root", tmp_path / "run", "--steps", "1", "--train-shards", "1", "3")
    run_train(tmp_path / "root", tmp_path / "run2", "--steps", "1")
    assert "left out shards [3]" in capsys.readouterr().out


def test_a_finished_run_saves_no_calibration_of_its_start(tiny_run, tmp_path):
    """--init-from a calibrated drafter: the new weights are saved without its calibration
    (and a stale calibration.json in the output is removed)."""
    from domino.budget import Calibration
    from domino.model import CALIBRATION_FILE, DominoDraftModel

    root, _ = tiny_run
    run_train(root, tmp_path / "first", "--steps", "1", "--eval-every", "100")
    base = DominoDraftModel.from_pretrained(tmp_path / "first" / "drafter")
    base.calibration = Calibration(edges=[0.5, 1.0], rates=[0.2, 0.7])
    base.save_pretrained(tmp_path / "base", dtype=torch.float32)
    (tmp_path / "run" / "drafter").mkdir(parents=True)
    (tmp_path / "run" / "drafter" / CALIBRATION_FILE).write_text((tmp_path / "base" / CALIBRATION_FILE).read_text())
    run_train(root, tmp_path / "run", "--init-from", str(tmp_path / "base"), "--steps", "1", "--eval-every", "100")
    assert not (tmp_path / "run" / "drafter" / CALIBRATION_FILE).exists()
    assert DominoDraftModel.from_pretrained(tmp_path / "run" / "drafter").calibration.edges == []


def test_a_dataset_refuses_shards_made_another_way(tmp_path):
    """generate_data records what made a dataset (dataset.json) and refuses to extend it
    with another target or prompt split, naming the argument."""
    import argparse

    from training.generate_data import check_manifest, dataset_manifest

    target, tok = tiny_target("llama", vocab=64), type("Tok", (), {"__len__": lambda self: 64})()
    args = argparse.Namespace(batch_size=64, max_new_tokens=256, max_prompt_tokens=256, top_k=32,
                              sample_temperature=0.7)
    made = dataset_manifest(target, tok, [0, 2], args)
    check_manifest(tmp_path, made)  # a new dataset: recorded
    check_manifest(tmp_path, made)  # the same settings: extended
    other_args = argparse.Namespace(**{**vars(args), "batch_size": 32})
    with pytest.raises(SystemExit, match="--batch-size: .* was made with batch_size 64, this run has 32"):
        check_manifest(tmp_path, dataset_manifest(target, tok, [0, 2], other_args))
    with pytest.raises(SystemExit, match="--target: .* was made with target"):
        check_manifest(tmp_path, dataset_manifest(tiny_target("qwen3", vocab=96), tok, [0, 2], args))
    tuned = tiny_target("llama", vocab=64)  # the same architecture, one weight nudged: a fine-tune
    with torch.no_grad():
        next(tuned.parameters()).view(-1)[0] += 0.5
    with pytest.raises(SystemExit, match="--target: .* was made with target_weights"):
        check_manifest(tmp_path, dataset_manifest(tuned, tok, [0, 2], args))
    check_manifest(tmp_path, dataset_manifest(tiny_target("llama", vocab=64).float(), tok, [0, 2], args))  # same weights
    hotter = argparse.Namespace(**{**vars(args), "sample_temperature": 1.0})
    with pytest.raises(SystemExit, match="--sample-temperature: .* was made with sample_temperature 0.7"):
        check_manifest(tmp_path, dataset_manifest(target, tok, [0, 2], hotter))
    # a dataset.json from before a setting existed: accepted, and the setting recorded
    older = {k: v for k, v in made.items() if k != "sample_temperature"}
    (tmp_path / "dataset.json").write_text(json.dumps(older))
    check_manifest(tmp_path, dataset_manifest(target, tok, [0, 2], hotter))
    assert json.loads((tmp_path / "dataset.json").read_text()) == {**older, "sample_temperature": 1.0}
    with pytest.raises(SystemExit, match="--sample-temperature"):
        check_manifest(tmp_path, made)


def test_features_of_other_layers_are_refused(tiny_run):
    from domino.config import default_drafter_config

    root, target = tiny_run
    layer_ids = default_drafter_config(target.config).target_layer_ids
    assert layer_ids != [0, 1]
    assert load_shards(root / "data", [1], layer_ids=layer_ids)
    with pytest.raises(ValueError, match=r"holds the features of target layers .* but the drafter reads \[0, 1\]"):
        load_shards(root / "data", [1], layer_ids=[0, 1])


def test_two_processes_refuse_what_would_train_them_apart(tiny_run, tmp_path):
    """Under torchrun, a step with fewer sequences than ranks and ranks that load other
    training shards are refused by name (the first once crashed in a reshape, the second
    trained each rank on other data silently), and a refused run leaves no gloo thread."""
    root, _ = tiny_run
    with pytest.raises(AssertionError, match=r"--seqs-per-step 1: fewer sequences a step than the 2 ranks"):
        run_train(root, tmp_path / "few", "--steps", "1", "--seqs-per-step", "1", nproc=2)
    # rank 1 reads a copy of the data without shard 2 (train_rank.py's DATA_FOR_RANK_1)
    other = tmp_path / "data_rank1"
    shutil.copytree(root / "data", other)
    for f in other.glob("shard_00002*"):
        f.unlink()
    with pytest.raises(AssertionError, match=r"the ranks loaded different training data") as e:
        run_train(root, tmp_path / "apart", "--steps", "1", nproc=2, env={"DATA_FOR_RANK_1": str(other)})
    assert "gloo threads alive" not in str(e.value) and "terminate called" not in str(e.value)
