"""Directories written once into a cache, atomically (the de-quantised default model, the
datastore's index)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable


def write_directory(out: Path, write: Callable[[Path], None], complete: Callable[[Path], bool]) -> None:
    """Makes the directory ``out`` by calling ``write(tmp)`` on a temporary sibling of this
    process's own (two processes filling one cache at once never write into one another's
    files) and renaming it to ``out``, so a killed write leaves no half-written ``out`` and no
    temporary. When another process finished first (``complete(out)``), its copy is kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would become the cache's
    try:
        write(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first: keep its copy
            if not complete(out):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:  # an error or an interrupt: no half-written temporary left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
