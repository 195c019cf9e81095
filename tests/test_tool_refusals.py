"""Tools that refuse instead of passing, or resuming, silently: a checkpoint made under other
settings names only what differs, and benchmark.py refuses a selection that measures nothing
(and lists every benchmark's flags in its `--help`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_binary

from tff_clustered.loop.state import RunState
from tff_clustered.run_folder import CHECKPOINT_NAME
from tff_clustered.runs import checkpoint
from tff_clustered.runs.checkpoint import CheckpointError

# A run's settings as `RunSpec.settings()` gives them: nested dicts, long when printed whole.
SETTINGS = {
    "algorithm": "fedgroup",
    "dataset": "digits",
    "model": "mlp",
    "num_clients": 40,
    "algorithm_options": {"num_clusters": 4, "pretrain_epochs": 3, "mu": 0.0},
    "training": {
        "rounds": 50,
        "clients_per_round": 10,
        "learning_rate": 0.1,
        "seed": 0,
        "server_optimizer": {"name": "sgd", "learning_rate": 1.0, "momentum": 0.9},
    },
}


def test_a_checkpoint_of_other_settings_names_only_those_that_differ(tmp_path: Path) -> None:
    path = str(tmp_path / CHECKPOINT_NAME)
    saved = RunState(
        round_num=1,
        cluster_models=np.zeros((1, 3), np.float32),
        assignment={},
        shared=(),
        anchor=None,
        algorithm_state=None,
        client_models={},
        history=[],
    )
    checkpoint.save(path, saved, SETTINGS)
    now = {
        **SETTINGS,
        "training": {
            **SETTINGS["training"],
            "rounds": 80,
            "server_optimizer": {**SETTINGS["training"]["server_optimizer"], "learning_rate": 0.5},
        },
        "algorithm_options": {**SETTINGS["algorithm_options"], "mu": 1.0},
    }
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(path, now)
    message = str(refused.value)
    details = message.split("other settings (", 1)[1].split("); ", 1)[0]
    # the learning rate shared by the client and the server optimizer is named by its path
    assert details == (
        "mu: checkpoint 0.0, now 1.0; rounds: checkpoint 50, now 80; "
        "training.server_optimizer.learning_rate: checkpoint 1.0, now 0.5"
    )
    assert message.endswith(
        "(the same flags as its run), start over with --overwrite, or choose another --output_dir"
    )
    assert "\n" not in message and "clients_per_round" not in message


# What `benchmark.py --help` lists: its own flags and those of every benchmark module.
BENCHMARK_HELP_FLAGS = (
    "api_population_algorithms api_population_repeats api_population_rounds api_population_sizes "
    "batch_size benchmarks client_data_rounds client_data_settings clients cluster_dim "
    "cluster_sizes dfl_rounds eval_clients eval_rounds "
    "examples_per_client groups hidden_units input_dim learning_rate local_epochs "
    "madc_max_clients memory_execution memory_rounds memory_warmup model num_classes "
    "pfllib_dir pfllib_python pfllib_threads population_algorithms population_dir "
    "population_dry_run population_executions "
    "population_plot population_rounds population_sizes rounds "
    "scaling_clients scaling_epochs scaling_rounds scoring_builds scoring_clients "
    "scoring_examples scratch_dir seed tf_logs tsdp_rounds "
    "tsdp_trigger uapdfl_neighbours unequal_sizes vs_pfllib_cycles vs_pfllib_dir "
    "vs_pfllib_workloads"
).split()


def test_benchmark_refuses_a_selection_that_measures_nothing() -> None:
    """An unknown name or an empty --benchmarks exits 2 listing the valid names, and `--help`
    lists every benchmark's flags (one process: benchmark.py imports TensorFlow before parsing
    its flags)."""
    script = (
        "import sys\n"
        "sys.argv = ['benchmark.py']\n"
        "from tff_clustered.cli import launch\n"
        "benchmark = launch.imported('benchmark')\n"
        "from tff_clustered.cli import exits\n"
        "for given in ('--benchmarks=no_such_benchmark', '--benchmarks=', "
        "'--benchmarks=clustering,nope'):\n"
        "    benchmark.FLAGS.unparse_flags()\n"
        "    try:\n"
        "        exits.parse_flags(['benchmark.py', given])\n"
        "    except SystemExit as e:\n"
        "        print('exit', e.code)\n"
        "shown = benchmark.FLAGS.get_key_flags_for_module(benchmark)\n"
        "print(' '.join(sorted(f.name for f in shown)))\n"
        "print(all(f'* `{n}`' in benchmark.__doc__ for n in benchmark.BENCHMARK_NAMES))\n"
    )
    done = run_binary(["-c", script], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    *exits, help_flags, every_benchmark_described = done.stdout.splitlines()
    assert exits == ["exit 2"] * 3, done.stdout + done.stderr[-2000:]
    # `--help` lists the flags of every benchmark module (adopted as benchmark.py's key flags)
    # and describes every benchmark.
    assert help_flags.split() == BENCHMARK_HELP_FLAGS, help_flags
    assert every_benchmark_described == "True"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and "unknown no_such_benchmark;" in errors[0], errors
    assert "nothing selected;" in errors[1] and "unknown nope;" in errors[2], errors
    assert all("choose from round_floors, fedavg_vs_tff," in e for e in errors), errors
