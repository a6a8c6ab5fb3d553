"""Test infrastructure: Triton's CPU interpreter re-patches triton.language on every call of
a @triton.jit helper made from inside a kernel (triton 3.8's
``InterpretedFunction.__call__`` runs ``_patch_lang``: ``inspect.getmembers`` over the
language modules its globals name, ~0.4 ms a call), although after the first such call of
a launch those modules stay patched until the launch ends. Our kernels call helpers in every
program instance, so the interpreted tests spent about a third of their time there (the
head's exponential-race test at 100 sequences: 17.4 of 48.6 s in ``_patch_builtin``, 43,221
calls; Zen 3 VM, 2026-12-02).

:func:`install` makes a helper called during a launch skip the re-patch when every
language module its globals name (``triton.language``, ``triton.language.core``) has been
patched in this launch already, by the launch itself or by an earlier helper; otherwise, and
outside any launch, the helper patches as before. It also answers the interpreter's
numpy-dtype lookups from a table (:func:`_memoize_np_dtype`). What the interpreter computes
does not change. Where the interpreter's internals are not the ones this was written against,
nothing is installed and the tests run as before, only slower."""

from __future__ import annotations

import functools
import threading


def install() -> bool:
    """Wraps the interpreter's kernel launch and helper call; True when installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid = getattr(interpreter, "GridExecutor", None)
    helper = getattr(interpreter, "InterpretedFunction", None)
    if (grid is None or helper is None or not hasattr(helper, "rewrite")
            or not hasattr(interpreter, "InterpreterError") or getattr(grid.__call__, "_domino", False)):
        return False
    launch_call, helper_call = grid.__call__, helper.__call__
    state = threading.local()  # .patched: ids of the modules patched in the launch in progress
    @functools.cache
    def langs(fn) -> frozenset:
        """The language modules _patch_lang(fn) patches: the ones fn's globals name."""
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    @functools.wraps(launch_call)
    def launch(self, *args, **kwargs):
        outer = getattr(state, "patched", None)
        kernel = getattr(self, "fn", None)  # the kernel whose modules the launch patches
        state.patched = None if kernel is None else set(langs(kernel))
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            state.patched = outer

    @functools.wraps(helper_call)
    def call_helper(self, *args, **kwargs):
        patched = getattr(state, "patched", None)
        needed = langs(self.fn)
        if patched is None or not needed <= patched:
            if patched is not None:
                patched |= needed
            return helper_call(self, *args, **kwargs)
        fn = self.rewrite()  # what helper_call does after its _patch_lang
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    launch._domino = True
    grid.__call__, helper.__call__ = launch, call_helper
    _memoize_np_dtype(interpreter, tl)
    return True


def _memoize_np_dtype(interpreter, tl) -> None:
    """The interpreter's ``_get_np_dtype`` builds its table of 19 Triton dtypes (hashing
    each) on every call, ~30 us, and it is called for every value an interpreted op makes
    (336,000 calls, a tenth of the head's exponential-race test). Its answer depends only on
    the scalar type's name (a block answers as its element type, any pointer as uint64; the
    table matches dtypes by name, ``tl.dtype.__eq__``), so the answers are kept by that name,
    each computed once by the original function."""
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or not hasattr(tl, "block_type"):
        return
    by_name = {}

    @functools.wraps(original)
    def np_dtype(tt_dtype):
        name = (tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype).name
        found = by_name.get(name)
        if found is None:
            found = by_name[name] = original(tt_dtype)
        return found

    interpreter._get_np_dtype = np_dtype
