"""Engine requests are validated before any work: each error names the argument."""

import pytest
import torch

from tiny_models import tiny_generator


@pytest.fixture(scope="module")
def gen():
    return tiny_generator("llama")


@pytest.mark.parametrize("method", ["generate", "generate_target_only"])
@pytest.mark.parametrize("prompt, kwargs, error, match", [
    ([1, 2, 3], dict(stop="20"), TypeError, "stop must be a list of strings"),
    ([1, 2, 3], dict(stop=[20]), TypeError, "stop must be a list of strings"),
    ([], {}, ValueError, "prompt is empty"),
    ([[1, 2], []], {}, ValueError, r"prompt\[1\] is empty"),
    (torch.tensor([], dtype=torch.int64), {}, ValueError, "prompt is empty"),
    ([1, 2, 3], dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
    ([1, 2, 3], dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    ([1, 2, 3], dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int"),
    ([{"role": "user"}], {}, ValueError, r"prompt\[0\] must have a string 'content'"),
    ([[{"role": "user", "content": "5 6"}], [{"content": "7"}]], {}, ValueError, r"prompt\[1\]\[0\] must have a string 'role'"),
    ([1, 64, 2], {}, ValueError, r"prompt must hold token ids in \[0, 64\)"),
    ([[1, 2], [-1, 3]], {}, ValueError, r"prompt\[1\] must hold token ids in \[0, 64\)"),
    (torch.tensor([1.0, 2.0]), {}, TypeError, "integer token ids"),
    ([1.5, 2], {}, TypeError, "prompt must be a string"),
    ([1] * 1000, dict(max_new_tokens=100), ValueError, "context window of 1024"),
    ([1, 2, 3], dict(temperature=-1.0), ValueError, "temperature must be finite and >= 0"),
])
def test_bad_requests_raise_naming_the_argument(gen, method, prompt, kwargs, error, match):
    if method == "generate_target_only" and "stop" in kwargs:
        pytest.skip("the baseline takes no stop strings")
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(error, match=match):
        getattr(gen, method)(prompt, **kwargs)


def test_valid_requests_still_run(gen):
    res = gen.generate([[3, 4, 5], [6, 7]], max_new_tokens=5, stop=["9"])
    assert len(res.token_ids) == 2
    assert len(gen.generate(torch.tensor([3, 4, 5]), max_new_tokens=3).token_ids) == 3
