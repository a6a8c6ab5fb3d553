"""Every public function, class, method and property of ``domino``, ``domino_ops`` and
``training`` has a docstring (the project's style: a docstring for every public function,
stating shapes and dtypes).

Public: a name without a leading underscore, defined in the module that holds it (not
imported into it). ``forward`` of an ``nn.Module`` is exempt: the class docstring says
what the module computes, as in PyTorch."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import domino
import domino_ops
import training


def public_objects_without_docstring(package) -> list[str]:
    missing = []
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) and not obj.__doc__:
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(obj):
                continue
            if not obj.__doc__:
                missing.append(f"{module.__name__}.{name}")
            for attr, member in vars(obj).items():
                if attr.startswith("_") or attr == "forward":
                    continue
                fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(fn) and not fn.__doc__:
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


@pytest.mark.parametrize("package", [domino, domino_ops, training], ids=lambda p: p.__name__)
def test_every_public_object_has_a_docstring(package):
    assert public_objects_without_docstring(package) == []


def test_the_check_finds_a_missing_docstring(monkeypatch):
    """Negative control: an undocumented public function and method are reported."""
    import domino.budget as module

    def undocumented():
        pass

    class Undocumented:
        def method(self):
            pass

    for obj in (undocumented, Undocumented):
        obj.__module__ = module.__name__
    monkeypatch.setattr(module, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(module, "Undocumented", Undocumented, raising=False)
    missing = public_objects_without_docstring(domino)
    assert {"domino.budget.undocumented", "domino.budget.Undocumented",
            "domino.budget.Undocumented.method"} <= set(missing)
