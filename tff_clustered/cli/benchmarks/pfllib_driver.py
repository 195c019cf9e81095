"""PFLlib's unmodified FedAvg run by its own `main.py`, with the times `vs_pfllib` compares.

Run by a Python that has torch (not this package's): `python pfllib_driver.py SYSTEM_DIR
OUT_JSON THREADS -- MAIN_PY_ARGS...`. It imports nothing of this package. In `SYSTEM_DIR` (a
copy of PFLlib's `system/` folder, beside the `dataset/` folder it reads), it runs `main.py` as
PFLlib's users do, having wrapped three methods of PFLlib's `Server` from outside (none of its
code changed): `select_clients` notes when the first round began, `evaluate` how long each
evaluation took, and `FedAvg.train` keeps the rounds' `Budget` (PFLlib's seconds per round,
evaluation included). OUT_JSON gets, from this process's start: `first_round_s` (when round 0
began), `budget_s` (each round) and `evaluate_s` (each evaluation, in round order).
THREADS > 0: `torch.set_num_threads(THREADS)` before PFLlib starts (0: torch's default).
Where torchvision cannot be imported (a CUDA build of it beside a CPU build of torch), an empty
module stands in for it, which `main.py` imports but its MLP (`DNN`) never uses; OUT_JSON then
says so (`torchvision_placeholder`), and PFLlib's start-up is short of torchvision's import.
"""

import time

STARTED = time.perf_counter()  # noqa: E402 - before the imports, as a process's start

import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402


def main(argv: list) -> None:
    """Runs PFLlib's main.py with `argv`'s arguments after `--` and writes the times."""
    system, out_json, threads = argv[1], argv[2], int(argv[3])
    main_args = argv[argv.index("--") + 1 :]
    os.chdir(system)
    sys.path.insert(0, system)
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    times: dict = {"first_round_s": None, "evaluate_s": [], "budget_s": []}
    try:
        import torchvision  # noqa: F401 - main.py imports it (its image models)
    except (ImportError, RuntimeError) as e:  # a CUDA build of it beside a CPU torch
        sys.modules["torchvision"] = types.ModuleType("torchvision")
        times["torchvision_placeholder"] = f"{type(e).__name__}: {e}"[:200]
    from flcore.servers.serveravg import FedAvg
    from flcore.servers.serverbase import Server

    select, evaluate, train = Server.select_clients, Server.evaluate, FedAvg.train

    def timed_select(self: Server) -> list:
        if times["first_round_s"] is None:
            times["first_round_s"] = time.perf_counter() - STARTED
        return select(self)

    def timed_evaluate(self: Server, *args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        result = evaluate(self, *args, **kwargs)
        times["evaluate_s"].append(time.perf_counter() - began)
        return result

    def kept_budget(self: FedAvg) -> None:
        train(self)
        times["budget_s"] = list(self.Budget)

    Server.select_clients, Server.evaluate, FedAvg.train = timed_select, timed_evaluate, kept_budget
    sys.argv = ["main.py", *main_args]
    runpy.run_path("main.py", run_name="__main__")
    with open(out_json, "w") as f:
        json.dump(times, f)


if __name__ == "__main__":
    main(sys.argv)
