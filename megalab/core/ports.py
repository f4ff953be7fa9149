"""The rendezvous port: torchrun's own on a single node, MASTER_PORT (default 6000) across nodes.

A fixed 6000 on one node meant that a run left behind by a killed launcher, or a second run on
the same machine, made the next one fail with EADDRINUSE. A free port picked here and bound by
torchrun seconds later was no cure: another socket can take it in between, and a launch failed the same
way (results/holdout/runs/20261126_082532___101-gpt2xl-dp1-gbs1-bf16). On one node
nobody else needs to know the port, so `torchrun --standalone` binds its store to port 0 itself,
with no gap between picking and binding. Across nodes every node must name the same port, so
MASTER_PORT (or its default) is kept. A MASTER_PORT the user sets always wins.
"""
from __future__ import annotations

DEFAULT_PORT = 6000  # multi-node default, as Megatron's examples use


def master_port(port: int | None, nnodes: int) -> int | None:
    """The port for this run: the user's, else None on one node (torchrun --standalone binds a free
    one), else DEFAULT_PORT."""
    if port is not None:
        return port
    return None if nnodes == 1 else DEFAULT_PORT


def describe(port: int | None, chosen: int | None, nnodes: int) -> str:
    """The preflight's line about the port."""
    if chosen is None:
        return "port       torchrun --standalone binds a free one as it starts (MASTER_PORT=... to choose)"
    why = "MASTER_PORT" if port is not None else "default for several nodes; MASTER_PORT=... to choose"
    return f"port       {chosen} ({why})"
