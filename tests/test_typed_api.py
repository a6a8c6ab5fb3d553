"""The public APIs of ``domino_ops`` and ``domino`` are typed (PEP 484) and ship their
``py.typed`` markers (PEP 561), as flashinfer's: every parameter and return of each
function in each package's ``__all__`` (and each public method of its public classes) is annotated, the
annotations resolve (``typing.get_type_hints``: a name used in an annotation must be
importable in the function's module at run time, not only under ``TYPE_CHECKING``), and
``py.typed`` sits beside the installed ``domino_ops`` and ``domino``."""

from __future__ import annotations

import __future__
import dataclasses
import inspect
import pathlib
import types
import typing

import pytest

import domino
import domino_ops

REPO = pathlib.Path(__file__).resolve().parents[1]
_EXEMPT_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def public_callables(namespace) -> dict[str, typing.Callable]:
    """The functions named in ``namespace.__all__`` and the public methods (static, class
    and property getters included) of the classes named there, by qualified name."""
    found = {}
    for name in namespace.__all__:
        obj = getattr(namespace, name)
        if inspect.isfunction(obj):
            found[name] = obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(fn):
                    found[f"{name}.{attr}"] = fn
    return found


def annotation_problems(fn: typing.Callable) -> list[str]:
    """What is wrong with ``fn``'s annotations: each parameter (but self / cls / *args /
    **kwargs) and the return without one, and a failure of ``typing.get_type_hints``."""
    problems = []
    sig = inspect.signature(fn)
    for name, param in sig.parameters.items():
        if name in ("self", "cls") or param.kind in _EXEMPT_KINDS:
            continue
        if param.annotation is inspect.Parameter.empty:
            problems.append(f"parameter {name!r} is not annotated")
    if sig.return_annotation is inspect.Signature.empty:
        problems.append("the return is not annotated")
    try:
        typing.get_type_hints(fn)
    except Exception as e:  # NameError for a name the module does not define, TypeError, ...
        problems.append(f"typing.get_type_hints fails: {type(e).__name__}: {e}")
    return problems


PUBLIC = {f"{package.__name__}.{name}": fn
          for package in (domino_ops, domino) for name, fn in public_callables(package).items()}


def test_the_public_api_is_found():
    """Every function of ``__all__`` is checked (a guard against a check of nothing)."""
    functions = {f"{package.__name__}.{name}" for package in (domino_ops, domino) for name in package.__all__
                 if inspect.isfunction(getattr(package, name))}
    assert functions <= set(PUBLIC)
    assert {f"domino_ops.{name}" for name in ("domino_head_rollout", "domino_head_expand", "verify_tree_sampling",
                                              "draft_tree", "small_batch_linear_packed", "apply_rotary_pos_emb")} <= functions
    assert {"domino.load", "domino.load_default", "domino.DominoGenerator.generate",
            "domino.DominoDraftModel.draft"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_function_is_fully_annotated(name):
    assert annotation_problems(PUBLIC[name]) == []


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_annotations_are_postponed(name):
    """Each public function's module has ``from __future__ import annotations``: the
    annotations stay strings, never evaluated at import time."""
    code = inspect.unwrap(PUBLIC[name]).__code__
    assert code.co_flags & __future__.annotations.compiler_flag, PUBLIC[name].__module__


DATACLASSES = {f"{package.__name__}.{name}": getattr(package, name) for package in (domino_ops, domino)
               for name in package.__all__ if dataclasses.is_dataclass(getattr(package, name))}


@pytest.mark.parametrize("name", sorted(DATACLASSES))
def test_public_class_annotations_resolve(name):
    """The public dataclasses' field annotations resolve too."""
    cls = DATACLASSES[name]
    hints = typing.get_type_hints(cls)
    assert hints and set(hints) >= set(getattr(cls, "__dataclass_fields__", {}))


def test_the_check_reports_missing_and_unresolvable_annotations():
    """Negative control: an unannotated parameter, a missing return annotation and an
    annotation naming what the module does not define are each reported, for a function
    and for a public method of a public class listed in ``__all__``."""

    def unannotated(x, y: int, *args, **kwargs):
        pass

    def fully_annotated(x: int, *args: int, **kwargs: int) -> None:
        pass

    def unresolvable(x) -> None:
        pass

    # as `x: Sequence[int]` with Sequence imported only under `if TYPE_CHECKING:`
    unresolvable.__annotations__ = {"x": "NotImportedAtRunTime[int]", "return": "None"}

    class Public:
        def method(self, a) -> None:
            pass

        def _private(self, a):
            pass

    namespace = types.SimpleNamespace(unannotated=unannotated, fully_annotated=fully_annotated,
                                      unresolvable=unresolvable, Public=Public,
                                      __all__=["unannotated", "fully_annotated", "unresolvable", "Public"])
    problems = {name: annotation_problems(fn) for name, fn in public_callables(namespace).items()}
    assert set(problems) == {"unannotated", "fully_annotated", "unresolvable", "Public.method"}
    assert problems["unannotated"] == ["parameter 'x' is not annotated", "the return is not annotated"]
    assert problems["fully_annotated"] == []
    assert len(problems["unresolvable"]) == 1
    assert "get_type_hints fails: NameError" in problems["unresolvable"][0]
    assert problems["Public.method"] == ["parameter 'a' is not annotated"]


@pytest.mark.parametrize("package", [domino_ops, domino], ids=lambda p: p.__name__)
def test_py_typed_marker_is_installed(package):
    """PEP 561: type checkers read the installed package's annotations only if it has a
    ``py.typed`` beside its ``__init__.py`` (scikit-build-core's ``wheel.packages`` copies
    every file of the package directory that git does not ignore)."""
    assert (pathlib.Path(package.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("package", ["domino_ops", "domino"])
def test_py_typed_marker_is_in_the_source_tree(package):
    if not (REPO / "python" / package / "__init__.py").is_file():
        pytest.skip("no source tree beside the tests")
    assert (REPO / "python" / package / "py.typed").is_file()
