"""Simulated with simulated, real with real: the one rule on which module may cool which
GPU, whatever the mapping says (docs/bridge.md, "Simulated modules and real GPUs").

A virtual module (``modbridge sim``: its hello says board ``sim``) is never paired with
a real GPU (NVML, nvidia-smi): its fans cool nothing, and a bridge that believed it
would leave a real GPU's power limit to a simulated world. A virtual GPU (``--sim``,
``--backend sim-remote``) is never paired with a real module: a real board's alarms
would cut nothing real. A module whose board is not known yet (no hello) gets no
verdict: the mapping stands until its hello says what it is.

>>> refusal("sim", gpu_simulated=True) is None, refusal("pico", gpu_simulated=False) is None
(True, True)
>>> refusal(None, gpu_simulated=False) is None
True
>>> refusal("sim", gpu_simulated=False).split(":")[0]
'a simulated module (board sim) is never paired with a real GPU'
"""

from __future__ import annotations

from modbridge.sanitize import sanitize

SIM_BOARD = "sim"  # boards/sim.py NAME: what a virtual module's hello says


def is_simulated_board(board: str) -> bool:
    """A virtual module's board: ``sim`` (or a ``sim_<variant>``)."""
    return board == SIM_BOARD or board.startswith(SIM_BOARD + "_")


def refusal(board: str | None, gpu_simulated: bool) -> str | None:
    """Why a module of ``board`` may not be paired with a GPU of a backend that is
    (``gpu_simulated``) or is not simulated; None when it may (or ``board`` is None:
    not known yet)."""
    if board is None:
        return None
    if is_simulated_board(board) and not gpu_simulated:
        return (
            f"a simulated module (board {sanitize(board)}) is never paired with a real GPU: "
            "run the bridge on the simulator's GPUs (--backend sim-remote beside "
            "`modbridge sim`, or --sim)"
        )
    if gpu_simulated and not is_simulated_board(board):
        return (
            f"a real module (board {sanitize(board)}) is never paired with a virtual GPU: "
            "use a real GPU backend (--backend auto, nvml or nvidia-smi)"
        )
    return None
