"""Building AdoptableServer rows from a command line (the adopt tests; no host, no process)."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.adopt.command import ParsedArgs, classify, parse_server_args
from app.core.adopt.scan import AdoptableServer, AdoptProof, GpuUse


def server_for(argv: Sequence[str], *, environ: dict[str, str] | None = None, gpus: dict[int, int] | None = None,
               pid: int = 4242, uid: int = 1000, user: str = "alice",
               custom: Sequence[tuple[str, Sequence[str]]] = ()) -> AdoptableServer:
    """The row `tunedash adopt` would make of a process running `argv` (python = argv[0])."""
    command = classify(argv, custom)
    assert command is not None, argv
    parsed = parse_server_args(command) if command.backend != "custom" else ParsedArgs()
    environ = {} if environ is None else environ
    return AdoptableServer(
        host="local", pid=pid, command=command, parsed=parsed,
        proof=AdoptProof("local", pid, "12345", uid, user, tuple(argv), argv[0], 0.0), started_at=1.7e9,
        python=command.interpreter or "/usr/bin/python3", python_note="", environ=environ, port=parsed.port,
        port_source="argv", gpus=GpuUse(gpus if gpus is not None else {}), cuda_visible=(environ or {}).get(
            "CUDA_VISIBLE_DEVICES"), log_target="/tmp/server.log", mine=True)
