"""Each comparison table's defaults for the flags the command line does not give.

The comparison tables `binaries/compare.py` writes: each table's defaults for the flags not
given on the command line (its columns, its paper's protocol, this project's values where the
paper gives none, and smaller scales on the embedded digits), which tables have a row per
setting (`setting_rows.py`), and the baselines a paper ran differently."""

from __future__ import annotations

from typing import Any, NamedTuple


class Defaults(NamedTuple):
    """Values of a table's flags on the datasets whose names start with one of `datasets`
    (every dataset when empty), and where they come from (`source`): the values a table took
    are printed and written in its header with their source."""

    source: str
    values: dict[str, Any]
    datasets: tuple[str, ...] = ()

    def applies_to(self, dataset: str) -> bool:
        return not self.datasets or dataset.startswith(self.datasets)


# The embedded digits (1,797 images): a whole table in minutes on 2 cores.
DIGITS = ("digits",)
# FedGroup's Table III setup on MNIST, and a scale of it for the embedded digits (the privacy
# and aggregation tables').
FEDGROUP_MNIST_SETUP = Defaults(
    "FedGroup's Table III setup (MNIST: m = 3, lr 0.03)",
    dict(
        num_clusters=3,
        learning_rate=0.03,
        local_epochs=20,
        clients_per_round=20,
        batch_size=10,
        pretrain_scale=20,
        pretrain_epochs=1,
        rounds=200,
        eval_every=10,
    ),
)
# FedGroup's table at the embedded digits' scale (4 planted groups in 40 clients).
FEDGROUP_DIGITS_SCALE = dict(
    num_clusters=4,
    rounds=30,
    local_epochs=3,
    clients_per_round=10,
    learning_rate=0.1,
    pretrain_scale=5,
    pretrain_epochs=3,
)
DIGITS_SCALE = Defaults(
    "the embedded digits' scale", dict(FEDGROUP_DIGITS_SCALE, eval_every=5), DIGITS
)
# Each table's defaults for the flags not given on the command line: its columns, the paper's
# protocol, this project's choices where the paper gives none, and the values that replace
# them on some datasets; a later group wins over an earlier one on the datasets both cover.
TABLES: dict[str, list[Defaults]] = {
    "fedgroup": [
        Defaults(
            "the table's columns",
            dict(
                algorithms=[
                    "fedavg",
                    "fedprox",
                    "ifca",
                    "fesem",
                    "fedgroup_rcc",
                    "fedgroup_rac",
                    "fedgroup",
                    "fedgrouprox",
                    "fedgroup_madc",
                    "fedgrouprox_madc",
                ],
            ),
        ),
        Defaults(
            "FedGroup's Table III setup",
            dict(
                local_epochs=20,
                clients_per_round=20,
                batch_size=10,
                pretrain_scale=20,
                pretrain_epochs=1,
                mu=1.0,
            ),
        ),
        Defaults(
            "this project's (FedGroup gives no rounds for Table III; its code runs 200)",
            dict(rounds=200),
        ),
        Defaults(
            "FedGroup's MNIST setup",
            dict(num_clusters=3, learning_rate=0.03),
            ("mnist",),
        ),
        Defaults(
            "FedGroup's FEMNIST setup",
            dict(num_clusters=5, learning_rate=0.003),
            ("femnist",),
        ),
        Defaults(
            "FedGroup's Synthetic(1,1) setup",
            dict(num_clusters=5, learning_rate=0.01),
            ("synthetic",),
        ),
        Defaults(
            "FedGroup's Sent140 setup",
            dict(num_clusters=5, learning_rate=0.3, mu=0.01),
            ("sent140",),
        ),
        # alpha = 5 so that 20 clients cluster and 20 are newcomers (alpha*m >= 40 would
        # cluster everyone and make RAC identical to FedGroup).
        Defaults(
            "the embedded digits' scale (4 planted groups in 40 clients; alpha = 5: 20 cluster)",
            FEDGROUP_DIGITS_SCALE,
            DIGITS,
        ),
    ],
    # FeSEM's baselines as ours: NoFed = Local, FedCluster = CFL, HypoCluster(3) = IFCA with 3
    # clusters. Micro accuracy is the pooled one, macro the unweighted mean over clients.
    "fesem": [
        Defaults(
            "the table's columns (FeSEM's Table 2)",
            dict(
                algorithms=[
                    "local",
                    "fedavg",
                    "fedprox",
                    "cfl",
                    "ifca:3",
                    "fesem:2",
                    "fesem:3",
                    "fesem:4",
                ],
            ),
        ),
        Defaults(
            "FeSEM's experiments (batch 10 from its code; it trains every device each round: set "
            "--clients_per_round to their number)",
            dict(local_epochs=5, mu=0.1, rounds=100, batch_size=10),
        ),
        Defaults("FeSEM's FEMNIST setup", dict(learning_rate=0.003), ("femnist",)),
        Defaults(
            "the embedded digits' scale (all 40 clients each round; FeSEM's lr 0.003 is its CNN's)",
            dict(clients_per_round=40, rounds=30, learning_rate=0.1),
            DIGITS,
        ),
    ],
    "fedtsdp": [
        Defaults(
            "the table's columns and rows (FedTSDP's Tables 3-5)",
            dict(
                algorithms=["fedavg", "fedprox", "ditto", "fedper", "cfl", "fedtsdp"],
                dataset="digits_dirichlet",
                model="tsdp_cnn",
                settings=["dirichlet:0.5", "dirichlet:0.2"],
            ),
        ),
        Defaults(
            "FedTSDP Sec. 4.1.4 (the same for every method)",
            dict(
                num_clients=20,
                clients_per_round=20,
                rounds=200,
                local_epochs=2,
                batch_size=50,
                learning_rate=0.05,
                lr_schedule="exponential",
                lr_decay=0.95,
                momentum=0.5,
            ),
        ),
        Defaults("this project's (FedTSDP gives FedProx no mu)", dict(mu=0.01)),
        # With the paper's 20 clients each holds ~54 training images and the client models
        # disagree enough on IID data for H to wander across 0.65; 10 clients of ~108 images
        # behave as the paper's IID runs do (H stays below h_th).
        Defaults(
            "the embedded digits' scale (10 clients of ~108 images: H stays below h_th on IID)",
            dict(
                num_clients=10,
                clients_per_round=10,
                rounds=20,
                batch_size=10,
                lr_decay=0.99,
                settings=["iid", "dirichlet:0.5", "dirichlet:0.2", "pathological"],
            ),
            DIGITS,
        ),
    ],
    "fedac": [
        Defaults(
            "the table's columns and rows (FedAC's Table 1)",
            dict(
                algorithms=[
                    "fedavg",
                    "fedper",
                    "fesem",
                    "fedgroup",
                    "flhc",
                    "cgpfl",
                    "ifca",
                    "fedac",
                ],
                dataset="digits_dirichlet",
                model="mlp",
                settings=["dirichlet:0.1", "pathological"],
            ),
        ),
        Defaults(
            "FedAC Sec. 5.1",
            dict(
                num_clients=100,
                clients_per_round=25,
                rounds=1000,
                local_steps=5,
                batch_size=32,
                classes_per_client=3,
            ),
        ),
        Defaults("FedAC Sec. 5.1 on CIFAR-100", dict(classes_per_client=8), ("cifar100",)),
        Defaults(
            "this project's (FedAC has lr 0.01 and gives no initial K)",
            dict(learning_rate=0.05, num_clusters=4),
        ),
        Defaults(
            "the embedded digits' scale",
            dict(num_clients=20, clients_per_round=5, rounds=40),
            DIGITS,
        ),
    ],
    "uapdfl": [
        Defaults(
            "the table's columns and rows (UA-PDFL's Tables 1-2)",
            dict(
                algorithms=[
                    "local_dfl",
                    "fedavg_dfl",
                    "criticalfl_dfl",
                    "fedper_dfl",
                    "dispfl",
                    "dfedavgm",
                    "uapdfl",
                ],
                dataset="digits_dirichlet",
                model="mlp",
                settings=["dirichlet:0.5", "dirichlet:5"],
            ),
        ),
        Defaults(
            "UA-PDFL Sec. 5.1",
            dict(
                num_clients=30,
                clients_per_round=30,
                num_neighbours=5,
                rounds=150,
                batch_size=50,
                learning_rate=0.05,
                lr_schedule="exponential",
                lr_decay=0.95,
                momentum=0.5,
            ),
        ),
        Defaults(
            "FedTSDP Sec. 4.1.4, by the same authors (UA-PDFL gives no E)", dict(local_epochs=2)
        ),
        Defaults(
            "the embedded digits' scale",
            dict(
                num_clients=10,
                clients_per_round=10,
                num_neighbours=3,
                rounds=20,
                batch_size=10,
                lr_decay=0.99,
            ),
            DIGITS,
        ),
    ],
    # Whether clustering still pays under differential privacy: FedGroup's MNIST setup with
    # each cluster's updates clipped and noised (`--aggregator=dp`), one row per privacy level.
    "privacy": [
        Defaults(
            "the table's columns and rows (privacy levels)",
            dict(
                algorithms=["fedavg", "ifca", "fedgroup", "fesem", "fedper"],
                dataset="mnist",
                model="mclr",
                settings=["mean", "epsilon:8", "epsilon:4", "epsilon:1"],
            ),
        ),
        FEDGROUP_MNIST_SETUP,
        Defaults(
            "this project's (the sampling the accountant amplifies by; FeSEM's E-step on the "
            "client, which privacy needs)",
            dict(client_sampling="poisson", fesem_estep="client"),
        ),
        DIGITS_SCALE,
    ],
    # What TFF's robust, compressed and secure aggregation cost per cluster, in accuracy and
    # bits: FedGroup's MNIST setup, one row per aggregator (MCLR's 7,840-value kernel is under
    # TFF's 20,000-value threshold, so the compressed rows lower it to 1,000).
    "aggregation": [
        Defaults(
            "the table's columns and rows (aggregators)",
            dict(
                algorithms=["fedavg", "ifca", "fesem", "fedgroup"],
                dataset="mnist",
                model="mclr",
                settings=["mean", "robust", "compression:8:1000", "compression:4:1000", "secure"],
            ),
        ),
        FEDGROUP_MNIST_SETUP,
        Defaults(
            "this project's (FeSEM's E-step on the client: its models then come from the "
            "aggregate)",
            dict(fesem_estep="client"),
        ),
        DIGITS_SCALE,
    ],
}
# Tables whose rows are settings (partitions, privacy levels: `setting_rows.py`), and
# whether the paper reports the unweighted mean over clients (FedAC's A9 reading, UA-PDFL)
# rather than the pooled accuracy.
SETTING_TABLES = {
    "fedtsdp": False,
    "fedac": True,
    "uapdfl": True,
    "privacy": False,
    "aggregation": False,
}
# Baselines run as the table's paper ran them, relative to the table's own settings: UA-PDFL
# (Sec. 5.1) gives DFedAvgM twice the local iterations and half the rounds.
PROTOCOLS: dict[str, dict[str, dict[str, float]]] = {
    "uapdfl": {"dfedavgm": {"local_work": 2, "rounds": 0.5}},
}
