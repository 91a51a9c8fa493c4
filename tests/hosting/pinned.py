"""Run last in the tox env ``hosting``'s ``commands_pre``: the vendor packages were installed
with ``--no-deps`` so that none of them moves torch off the pinned CPU build; fail loudly if
one did anyway (an unpinned torch resolves to a multi-GB CUDA build)."""

import sys

import torch

PINNED = "2.13.0"

if __name__ == "__main__":
    found = torch.__version__.split("+")[0]
    if found != PINNED:
        sys.exit(f"torch is {torch.__version__}, expected {PINNED}: a vendor package's dependencies moved it")
    print(f"torch {torch.__version__}: still the pinned build")
