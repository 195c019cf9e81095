"""The flags the binaries share, turned into a run's `RunSpec` and its `RunExecution`.

Command-line flags shared by the binaries: dataset, model, training and algorithm options,
and the TFF runtime. `run_spec_from_flags` turns them into a `RunSpec`: the dataset's flags
into its `DataSpec` and the model's into its `ModelChoice`, flag by field of the same name."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TypeVar

from absl import flags

from tff_clustered import options as options_lib
from tff_clustered.algorithms import ALGORITHMS, algorithm_class, define_all_flags
from tff_clustered.cli import aggregator_flags, exits, logs
from tff_clustered.data import DATASET_NAMES, DataError, DataSpec
from tff_clustered.data.spec import MIN_CLASSES
from tff_clustered.federated.server_optimizers import SERVER_OPTIMIZERS, ServerOptimizer
from tff_clustered.loop.client_store import CLIENT_STORES
from tff_clustered.loop.config import LR_SCHEDULES, TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.phases import PhaseTimer
from tff_clustered.loop.sampling import SAMPLINGS
from tff_clustered.models import MODEL_NAMES
from tff_clustered.runs.checkpoint import CheckpointError
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runtime import signals
from tff_clustered.runtime.context import CLIENT_DATA, RuntimeConfig, WorkerLostError

Record = TypeVar("Record")

FLAGS = flags.FLAGS
flags.DEFINE_enum("dataset", "digits", list(DATASET_NAMES), "Dataset.")
flags.DEFINE_string(
    "data_dir",
    None,
    "Folder of the dataset's files (LEAF: holds train/ test/; pathmnist: holds pathmnist.npz, "
    "or the file itself; mnist, mnist_partitioned, fashion_mnist: the four IDX files or Keras' "
    ".npz; mnist_writers: those of MNIST and writers.npz; tff_emnist, tff_cifar100, "
    "tff_shakespeare, tff_stackoverflow: TFF's cache folder with emnist_all.sqlite, "
    "cifar100.sqlite, shakespeare.sqlite or stackoverflow.sqlite).",
)
flags.DEFINE_enum("model", "mlp", list(MODEL_NAMES), "Model architecture.")
flags.DEFINE_string("glove_path", None, "GloVe text file (sent140), e.g. glove.6B.300d.txt.")
flags.DEFINE_integer("hidden_units", 64, "Hidden units of the MLP.", lower_bound=1)
flags.DEFINE_integer("cnn_dense_units", 128, "Units of the CNN's dense layer.", lower_bound=1)
flags.DEFINE_integer(
    "num_clients",
    None,
    "Clients to generate or deal to (unset: the dataset's default); mnist_writers: writers kept, "
    "a seeded random choice (unset: all 539); tff_emnist, tff_cifar100, tff_shakespeare, "
    "tff_stackoverflow, tff_sql: a seeded random choice of the file's clients (unset: all; "
    "tff_stackoverflow then reads each client when a round first needs it, and needs TFF's "
    "stackoverflow.word_count and stackoverflow.tag_count beside the database).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "num_classes",
    None,
    "Classes (LEAF; tff_emnist: 10 or 62; tff_cifar100: 100 fine or 20 coarse; "
    "tff_stackoverflow: its most frequent tags, default 500; default: from the labels).",
    lower_bound=MIN_CLASSES,
)
flags.DEFINE_integer("rounds", 50, "Communication rounds.", lower_bound=1)
flags.DEFINE_integer("clients_per_round", 10, "Clients sampled per round.", lower_bound=1)
flags.DEFINE_enum(
    "client_sampling",
    "fixed",
    list(SAMPLINGS),
    "How each round's clients are drawn from the eligible ones: fixed (exactly "
    "--clients_per_round, uniformly without replacement) or poisson (each independently with "
    "probability clients_per_round / eligible clients; a round may have none). "
    "docs/privacy.md gives each one's privacy accounting.",
)
flags.DEFINE_integer("local_epochs", 5, "Local epochs per round.", lower_bound=1)
flags.DEFINE_integer(
    "local_steps",
    0,
    "Minibatch steps per client and round instead of --local_epochs passes (0: epochs).",
    lower_bound=0,
)
flags.DEFINE_integer("batch_size", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_float("learning_rate", 0.1, "Client learning rate.")
flags.DEFINE_enum(
    "lr_schedule", "constant", list(LR_SCHEDULES), "Per-round learning rate schedule."
)
flags.DEFINE_float("lr_decay", 0.98, "Per-round decay of the exponential schedule.")
flags.DEFINE_float("momentum", 0.0, "Client SGD momentum.")
flags.DEFINE_enum(
    "server_optimizer",
    "sgd",
    list(SERVER_OPTIMIZERS),
    "The server's step with each cluster's mean update, one optimizer state per cluster: sgd "
    "(at --server_learning_rate=1: FedAvg's, add it), sgdm (FedAvgM: server momentum), adam "
    "(FedAdam). Not for decentralized algorithms.",
)
flags.DEFINE_float(
    "server_learning_rate",
    1.0,
    "Server learning rate (1 with sgd: FedAvg; FedAdam's paper tunes it, often 1e-2 to 1e-1).",
)
flags.DEFINE_float("server_momentum", 0.9, "Server momentum of --server_optimizer=sgdm.")
flags.DEFINE_float(
    "server_epsilon", 1e-3, "Adaptivity tau of --server_optimizer=adam (FedAdam's 1e-3)."
)
flags.DEFINE_enum(
    "partition",
    None,
    ["iid", "dirichlet", "pathological", "shards", "fedac_dirichlet", "fedac_pathological"],
    "How cifar10/cifar100/svhn/fashion_mnist/mnist_partitioned/pathmnist are dealt to clients "
    "(unset: dirichlet); shards: 2 label-sorted shards per client (McMahan et al.); fedac_*: "
    "cifar10/cifar100/svhn/fashion_mnist/mnist_partitioned as FedAC deals them (UniformInt[50, "
    "350] images per client, local tests from the test split; alpha = --dirichlet_beta, labels "
    "= --classes_per_client).",
)
flags.DEFINE_float("dirichlet_beta", None, "Dirichlet concentration beta (unset: dataset default).")
flags.DEFINE_integer("classes_per_client", 2, "Classes per client of the pathological partition.")
flags.DEFINE_string("tfds_dir", None, "Read cifar10/cifar100/svhn from this TFDS data directory.")
flags.DEFINE_integer(
    "train_examples",
    None,
    "cifar10/cifar100/svhn/fashion_mnist/mnist_partitioned: deal a seeded uniform choice of "
    "this many training images instead of all (a smaller run on the same distribution).",
    lower_bound=1,
)
flags.DEFINE_enum(
    "split",
    "test",
    ["test", "validation"],
    "The examples the run scores: test (the reported figures), or validation (a seeded 15 % "
    "of each client's training examples, held out and not trained on: for tuning, never a "
    "test figure; docs/tuning.md).",
)
flags.DEFINE_integer("resnet_width", 64, "Channels of resnet18's first stage.", lower_bound=1)
# Each algorithm's own options (num_clusters, mu, personal_layers, FedGroup's, FedTSDP's, ...)
# are declared in its file, as the fields of its Options.
define_all_flags()
flags.DEFINE_integer("seed", 0, "Seed of every random choice in the run.", lower_bound=0)
flags.DEFINE_integer(
    "checkpoint_every", 5, "Checkpoint every N rounds (0: at the end).", lower_bound=0
)
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
flags.DEFINE_integer("eval_every", 1, "Evaluate every N rounds.", lower_bound=1)
flags.DEFINE_bool(
    "eval_at_start",
    True,
    "Score the models before round 1 (metrics.csv's round 0, the first point of curves.png: "
    "the initial model, or the cold start's clusters). --noeval_at_start: round 1's row is the "
    "first, and round 1 starts sooner.",
)
flags.DEFINE_integer(
    "eval_clients",
    0,
    "If > 0, each evaluation scores this many clients: a sample drawn from the seed and the "
    "client ids only, the same for every round and every algorithm of a seed (0: every client).",
    lower_bound=0,
)
flags.DEFINE_integer(
    "fine_tune_steps",
    0,
    "If > 0, each evaluation also scores every client after this many minibatches of local SGD "
    "on its own training data from its global or cluster model (columns *_finetuned).",
    lower_bound=0,
)
flags.DEFINE_float(
    "max_diverged_fraction",
    0.25,
    "Clients whose update has NaN/inf are left out of a round; more than this fraction of a "
    "round's clients stops the run.",
    lower_bound=0.0,
    upper_bound=1.0,
)
flags.DEFINE_enum(
    "execution",
    "tff",
    ["tff", "in_process"],
    "What runs each round: tff (TFF's runtime, CPU) or in_process (the same TF functions run by "
    "TensorFlow in this process: on a GPU when TensorFlow sees one). Same results either way.",
)
flags.DEFINE_enum(
    "client_store",
    "auto",
    list(CLIENT_STORES),
    "Where the clients' own models (FedPer's heads, Ditto's personal models, stateful clients' "
    "models) live: memory, disk (client_store.bin in --output_dir, a checkpoint holds only "
    "its index), or auto (disk when that file would exceed 1 GiB). Same results either way.",
)
flags.DEFINE_string(
    "device",
    None,
    "With --execution=in_process: the TensorFlow device of the rounds (e.g. /GPU:1). "
    "Default: TensorFlow's choice, the first GPU if it sees one.",
)
flags.DEFINE_list(
    "workers",
    [],
    "TFF workers HOST:PORT started with binaries/worker.py; with several, each round's clients "
    "are split over them (empty: one local worker).",
)
flags.DEFINE_enum(
    "client_data",
    "auto",
    list(CLIENT_DATA),
    "With --execution=tff: how each sampled client's training examples reach TFF's worker: sent "
    "as arrays by this process, or read_on_worker: from the file of --dataset=tff_sql (every "
    "worker must open it at the same path), or for data in memory from files this process "
    "writes once in its temporary folder (workers on this machine); auto: the faster for the "
    "setting (docs/runtime.md). Same results either way.",
)
flags.DEFINE_float(
    "worker_timeout",
    30.0,
    "Seconds a TFF worker may take to answer a liveness probe while a call to it is under way "
    "(it is probed every 10 s; a long round on a live worker is never cut). A worker that does "
    "not answer in time is named and the run stops with exit code 3. Lengthen it for a heavily "
    "loaded or distant worker.",
)
flags.DEFINE_integer(
    "max_concurrent_computation_calls",
    -1,
    "Concurrent client computations in the worker (-1: no limit).",
)


def run_spec_from_flags(algorithm: str, row_aggregators: Collection[str] = ()) -> RunSpec:
    """The run that the parsed flags describe, for `algorithm`; the settings of the
    `row_aggregators` (a comparison table's rows') are left to those rows
    (`aggregator_flags.aggregator_config_from_flags`)."""
    return RunSpec(
        algorithm=algorithm,
        data=record_from_flags(DataSpec),
        model_choice=record_from_flags(ModelChoice),
        algorithm_options=options_lib.from_flags(algorithm_class(algorithm).Options),
        training=TrainingConfig(
            rounds=FLAGS.rounds,
            clients_per_round=FLAGS.clients_per_round,
            client_sampling=FLAGS.client_sampling,
            local_epochs=FLAGS.local_epochs,
            local_steps=FLAGS.local_steps,
            batch_size=FLAGS.batch_size,
            learning_rate=FLAGS.learning_rate,
            lr_schedule=FLAGS.lr_schedule,
            lr_decay=FLAGS.lr_decay,
            momentum=FLAGS.momentum,
            seed=FLAGS.seed,
            eval_every=FLAGS.eval_every,
            eval_at_start=FLAGS.eval_at_start,
            eval_clients=FLAGS.eval_clients,
            fine_tune_steps=FLAGS.fine_tune_steps,
            max_diverged_fraction=FLAGS.max_diverged_fraction,
            server_optimizer=ServerOptimizer(
                FLAGS.server_optimizer,
                learning_rate=FLAGS.server_learning_rate,
                momentum=FLAGS.server_momentum,
                epsilon=FLAGS.server_epsilon,
            ),
            aggregator=aggregator_flags.aggregator_config_from_flags(rows=row_aggregators),
        ),
    )


def record_from_flags(cls: type[Record]) -> Record:
    """The dataclass `cls` (`DataSpec`, `ModelChoice`) with each field the value of the flag
    of its name, checked as the record checks it."""
    return cls(**{field.name: FLAGS[field.name].value for field in dataclasses.fields(cls)})


def refuse_other_algorithms_flags(algorithms: Sequence[str]) -> None:
    """A flag given on the command line that none of `algorithms` takes is an error (it would
    otherwise be silently ignored, e.g. --mu for FedGroup, which is FedGrouProx's), and so is
    an aggregator's cold-start setting (`--dp_cold_start*`) when none of them has a cold start
    that reads clients' updates (FedAvg, IFCA)."""
    classes = [algorithm_class(a) for a in algorithms]
    own = set().union(*(options_lib.names(cls.Options) for cls in classes))
    for other in ALGORITHMS.values():
        for name in options_lib.names(other.Options):
            if name not in own and FLAGS[name].present:
                hints = [cls.refused[name] for cls in classes if name in cls.refused]
                hint = hints[0] if hints else f"it is an option of {other.name}"
                refuse_flag(algorithms, name, hint)
    if not any(cls.releases.cold_start for cls in classes):
        with_one = [name for name, cls in ALGORITHMS.items() if cls.releases.cold_start]
        for name in aggregator_flags.cold_start_flags():
            if FLAGS[name].present:
                refuse_flag(
                    algorithms,
                    name,
                    "it has no cold start that reads clients' updates, the only use of the flag "
                    f"(those of {', '.join(with_one)} do)",
                )


def refuse_flag(algorithms: Sequence[str], name: str, hint: str) -> None:
    """Raises the one-line error that `algorithms` take no `--name`, with `hint` (why) and the
    flagfiles that may have set it."""
    which = ",".join(algorithms)
    flagfiles = flagfiles_given(sys.argv[1:])
    source = f" (set in {', '.join(flagfiles)}?)" if flagfiles else ""
    raise ValueError(
        f"--algorithm{'s' if len(algorithms) > 1 else ''}={which} "
        f"take{'' if len(algorithms) > 1 else 's'} no --{name}{source}: {hint}"
    )


def flagfiles_given(args: Sequence[str]) -> list[str]:
    """The files of `--flagfile=FILE` and `--flagfile FILE` (absl reads both) in `args`."""
    files = []
    for i, arg in enumerate(args):
        if arg.startswith(("--flagfile=", "-flagfile=")):
            files.append(arg.split("=", 1)[1])
        elif arg in ("--flagfile", "-flagfile") and i + 1 < len(args):
            files.append(args[i + 1])
    return files


def execution_from_flags(output_dir: str, timer: PhaseTimer) -> RunExecution:
    """How the runs of this command execute (the runtime's flags, its worker's log in
    `output_dir`; `--client_store`), their phases timed by `timer`."""
    runtime = RuntimeConfig(
        execution=FLAGS.execution,
        device=FLAGS.device,
        workers=tuple(FLAGS.workers),
        client_data=FLAGS.client_data,
        max_concurrent_computation_calls=FLAGS.max_concurrent_computation_calls,
        log_dir=output_dir,
        worker_timeout_s=FLAGS.worker_timeout,
    )
    return RunExecution(runtime, timer, FLAGS.client_store, output_dir)


# File-system errors that are the user's to fix, not bugs: no space, quota, read-only, denied,
# a write that did not reach the disk.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


@contextlib.contextmanager
def reported_errors(on_interrupt: Callable[[], str]) -> Iterator[None]:
    """Bad input: `error: ...` on stderr and exit code 2; a TFF worker lost or unreachable:
    exit 3 (the message names it); a file the outputs cannot be written to: exit 2 with the
    file and the reason; Ctrl-C or SIGTERM: `on_interrupt()` (asked then: what the stopped
    work left), exit 130 or 143.
    The runtime's own context manager has stopped the TFF worker by then."""

    def after() -> str:
        return f"; {on_interrupt()}"

    with exits.one_line_on_signals("", after), _exit_codes_of_errors(on_interrupt):
        yield


@contextlib.contextmanager
def _exit_codes_of_errors(on_interrupt: Callable[[], str]) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        # An error that follows a signal is its consequence: the TFF worker stopped by the
        # signal's handler no longer answers a call in flight, or the handler's exception
        # left TensorFlow's eager context half made ("Was eager Context initialized?"). The
        # user asked the run to stop: the signal's line and exit code, not this error.
        signals.reraise_received_signal()
        if isinstance(e, (ValueError, DataError, CheckpointError)):
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if isinstance(e, WorkerLostError):
            # The worker is named at once, and the process ends without the interpreter's
            # shutdown: after a lost connection, TensorFlow's and gRPC's native teardown
            # waits on the lost worker. The runtime has stopped and every file was written
            # atomically by then.
            exits.exit_at_once(f"error: {e}", 3)
        if isinstance(e, OSError) and e.errno in OUTPUT_ERRNOS:
            # A write that failed mid-run (disk full, a folder made read-only): the atomic
            # writers left the previous files whole.
            where = e.filename or "the output folder"
            # The system's own text gets the general fix; a message of ours names its own.
            fix = "free space or fix the folder; " if e.strerror == os.strerror(e.errno) else ""
            print(f"error: {where}: {e.strerror}; {fix}({on_interrupt()})", file=sys.stderr)
            raise SystemExit(2) from None
        raise
