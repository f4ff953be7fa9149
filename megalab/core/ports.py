"""The rendezvous port: a free one on a single node, MASTER_PORT (default 6000) across nodes.

A fixed 6000 on one node meant that a run left behind by a killed launcher, or a second run on
the same machine, made the next one fail with EADDRINUSE. On one node nobody else needs to know
the port, so the launcher asks the kernel for a free one. Across nodes every node must name the
same port, so MASTER_PORT (or its default) is kept. A MASTER_PORT the user sets always wins.
"""
from __future__ import annotations

import socket

DEFAULT_PORT = 6000  # multi-node default, as Megatron's examples use


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (bind to port 0 and read what the kernel gave)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def master_port(port: int | None, nnodes: int) -> int:
    """The port for this run: the user's, else free on one node, else DEFAULT_PORT."""
    if port is not None:
        return port
    return free_port() if nnodes == 1 else DEFAULT_PORT


def describe(port: int | None, chosen: int, nnodes: int) -> str:
    """The preflight's line about the port."""
    why = ("MASTER_PORT" if port is not None else
           "free port picked for this run; MASTER_PORT=... to choose" if nnodes == 1 else
           "default for several nodes; MASTER_PORT=... to choose")
    return f"port       {chosen} ({why})"
