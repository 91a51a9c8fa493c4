"""Run last in the tox env ``hosting``'s ``commands_pre``: the vendor packages were installed
with ``--no-deps`` so that none of them moves torch off the pinned CPU build; fail loudly if
one did anyway (an unpinned torch resolves to a multi-GB CUDA build). Reads the installed
distribution's version (what ``torch.__version__`` says) without importing torch, a few CPU
seconds less per run."""

import sys
from importlib.metadata import version

PINNED = "2.13.0"

if __name__ == "__main__":
    found = version("torch")
    if found.split("+")[0] != PINNED:
        sys.exit(f"torch is {found}, expected {PINNED}: a vendor package's dependencies moved it")
    print(f"torch {found}: still the pinned build")
