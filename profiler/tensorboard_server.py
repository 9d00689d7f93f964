"""TensorBoard on loopback over the runs folder (`devprof tensorboard` serves it until Ctrl-C)."""

from __future__ import annotations


def launch(logdir: str, port: int = 0):
    """Start TensorBoard in this process on 127.0.0.1; returns (server, url).

    Loopback only: TensorBoard has no authentication, and traces can show paths and code.
    """
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
                          "--reload_interval", "5"])
    url = board.launch()
    return board, url
