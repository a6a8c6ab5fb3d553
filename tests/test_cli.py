"""``domino generate``: arguments checked before any model loads, the streamed text, and --compare."""

from types import SimpleNamespace

import pytest

from domino import cli


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: the errors must come first."""
    import domino
    import domino.loading

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    for owner in (domino, domino.loading):
        monkeypatch.setattr(owner, "load", refuse)
        monkeypatch.setattr(owner, "load_default", refuse)


@pytest.mark.parametrize("args, msg", [
    (["--tree", "0,3"], "topk must be"),
    (["--tree", "3"], "--tree 3: give TOPK,DEPTH"),  # not the usage line's metavar
    (["--tree", "2,x"], "invalid literal"),
    (["--tree", ""], "--tree : give TOPK,DEPTH"),  # not silently the default
    (["--max-new-tokens", "0"], "generate: error: --max-new-tokens must be >= 1"),
    (["--temperature", "-1"], "--temperature must be finite and >= 0"),
    (["--top-p", "0"], "--top-p must be"),
    (["--top-k", "-1"], "--top-k must be"),
    (["--num-drafts", "-1"], "--num-drafts must be >= 0"),
    (["--compare", "--repeats", "0"], "--repeats must be >= 1"),
    (["--tree", "3,4,16", "--temperature", "0.7"], "num_draft_tokens must be None"),
    (["--tree", "3,4", "--num-drafts", "3"], "--num-drafts is a chain's size"),
    (["--lookup-tokens", "-1"], "--lookup-tokens must be >= 0"),
    (["--datastore-tokens", "-3"], "--datastore-tokens must be >= 0"),
    (["--target", "/nonexistent/model"], "--target: no directory /nonexistent/model"),
    (["--drafter", "/nonexistent/drafter"], "--drafter: no directory /nonexistent/drafter"),
])
def test_bad_arguments_fail_before_loading_anything(no_loading, capsys, args, msg):
    with pytest.raises(SystemExit):
        cli.main(["generate", "hi", *args])
    assert msg in capsys.readouterr().err


class ByteTokenizer:
    """Decodes ids as UTF-8 bytes (256: an EOS, a special token), as byte-level BPE
    tokenizers do: a character split over two tokens decodes to U+FFFD until complete."""

    def decode(self, ids, skip_special_tokens=False):
        text = bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return text if skip_special_tokens or 256 not in ids else text + "<eos>"


def test_streamed_text_skips_eos_and_joins_split_characters(capsys):
    printer = cli.TextPrinter(ByteTokenizer())
    data = "añ 你好".encode()
    rounds = [list(data[:2]), list(data[2:4]), list(data[4:7]), list(data[7:]) + [256]]
    for ids in rounds:  # "ñ" and "你" are split across rounds
        printer(0, ids)
    out = capsys.readouterr().out
    assert out == "añ 你好" and "\ufffd" not in out


def test_streamed_text_prints_what_precedes_a_split_character_and_the_rest_at_the_end(capsys):
    """Every round ending inside a character: each round still prints its complete text
    (the printer once held back all of it, and lost whatever the last round added when the
    output itself ended inside a character); finish() prints the incomplete rest."""
    printer = cli.TextPrinter(ByteTokenizer())
    data = "ab🌟c🌟".encode()
    for ids in (list(data[:3]), list(data[3:8]), list(data[8:10])):  # each ends inside a star
        printer(0, ids)
    assert capsys.readouterr().out == "ab🌟c"
    printer.finish()
    assert capsys.readouterr().out == "\ufffd"  # the output ended inside the last star


class FakeGenerator:
    """Records the calls the CLI makes; Domino's runs report 30 tok/s, the target's 20, and
    Domino's output differs from the target's when ``differ``."""

    def __init__(self, differ=False, loop_tps=15.0):
        self.calls, self.differ, self.tokenizer, self.loop_tps = [], differ, ByteTokenizer(), loop_tps

    def generate(self, prompt, stream=None, **kw):
        self.calls.append(("domino", prompt, stream is not None))
        ids = [104, 105] + ([33] if self.differ else [])
        if stream is not None:
            stream(0, ids)
        return SimpleNamespace(token_ids=ids, tokens_per_second=30.0, mean_acceptance_length=2.0,
                               acceptance_lengths=[2])

    def generate_target_only(self, prompt, **kw):
        self.calls.append(("target", prompt, False))
        return SimpleNamespace(token_ids=[104, 105], tokens_per_second=20.0)

    def generate_plain(self, prompt, **kw):
        self.calls.append(("loop", prompt, False))
        return SimpleNamespace(token_ids=[104, 105], tokens_per_second=self.loop_tps)


@pytest.mark.parametrize("differ,loop_tps", [(False, 15.0), (True, 15.0), (False, 24.0)])
def test_compare_times_both_sides_alike(monkeypatch, capsys, differ, loop_tps):
    """--compare warms every side up, then alternates timed runs with streaming off and
    reports the medians' ratio against the faster way to run the target alone (HF
    generate or the engine's loop); a greedy output that differs from the target's fails."""
    import domino

    fake = FakeGenerator(differ, loop_tps)
    monkeypatch.setattr(domino, "load_default", lambda quiet=False: fake)
    status = cli.main(["generate", "hi", "--compare", "--repeats", "2", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    timed = [("target", "hi", False), ("loop", "hi", False), ("domino", "hi", False)]
    assert fake.calls == [("domino", "warm-up", False), ("domino", "hi", True), ("target", "warm-up", False),
                          ("loop", "warm-up", False), *timed, *timed]
    base = max(20.0, loop_tps)
    assert (f"median of 2 alternating runs each: Domino 30.0 tok/s, target alone {base:.1f} tok/s (HF generate "
            f"20.0, engine loop {loop_tps:.1f}); speedup {30.0 / base:.2f}x") in err
    assert status == (1 if differ else 0) and ("DIFFER" in err) == differ


def test_an_error_only_the_loaded_models_can_find_is_a_usage_error(monkeypatch, capsys):
    """A request the loaded models refuse (here: a drafter too shallow for --num-drafts)
    ends as argparse's usage error naming the problem, not a traceback."""
    import domino

    fake = FakeGenerator()

    def refuse(prompt, stream=None, **kw):
        raise ValueError("num_drafts must be in [0, 15] (the drafter's block), got 20")

    fake.generate = refuse
    monkeypatch.setattr(domino, "load_default", lambda quiet=False: fake)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hi", "--num-drafts", "20"])
    assert exit_info.value.code == 2
    assert "error: num_drafts must be in [0, 15]" in capsys.readouterr().err


def test_a_drafter_directory_that_is_no_checkpoint_is_a_usage_error(tmp_path, capsys):
    """A directory without a drafter's config (here: empty) ends as a usage error naming the
    drafter, before the target is loaded, not as a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "hi", "--drafter", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "generate: error: drafter: no config.json in" in capsys.readouterr().err


def test_help_and_the_package_import_load_neither_torch_nor_transformers():
    """`domino --help` answers at once: importing the package and the command line module
    loads neither torch nor transformers (6.4 s on the 2-core Zen 4 VM when the package
    imported everything up front); the public names still load on first use."""
    import subprocess
    import sys

    code = ("import sys, domino, domino.cli; heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy; assert callable(domino.load) and domino.TreeShape and domino.tree.DEFAULT_TREE; "
            "assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "domino.cli", "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "generate" in out.stdout
