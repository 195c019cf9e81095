"""The per-seed diagnostics of a comparison table: clusters in use, their sizes, triggers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tff_clustered.algorithms.dfl import FedAvgDFL
from tff_clustered.algorithms.fedtsdp import FedTSDP
from tff_clustered.algorithms.uapdfl import UAPDFL
from tff_clustered.comparison import committed_tables, numerics, run_rows, standings, table_writer


def rows(sizes: list[int], clustered: list[int]) -> list[dict]:
    history = [{"round": 0, **{f"cluster_size_{k}": 0.0 for k in range(len(sizes))}}]
    for r, flag in enumerate(clustered, start=1):
        row = {"round": r, "clustered": flag}
        row.update({f"cluster_size_{k}": float(v) for k, v in enumerate(sizes)})
        history.append(row)
    return history


def test_diagnostics_give_clusters_in_use_with_their_sizes_largest_first() -> None:
    d = run_rows.diagnostics(rows([5, 0, 28, 70], [0, 1, 0]), FedTSDP)
    assert d["clusters"] == 3 and d["cluster_sizes"] == "70+28+5" and d["triggers"] == 1
    peers = run_rows.diagnostics(rows([5, 5], [0]), FedAvgDFL)
    assert peers["clusters"] is None and peers["cluster_sizes"] is None
    assert "triggers" not in peers  # an algorithm's own figures come from its class only


def test_sizes_are_shown_only_where_some_seed_formed_clusters() -> None:
    clustered = [
        {"method": "fedtsdp", **run_rows.diagnostics(rows(s, [0]), FedTSDP)}
        for s in ([10, 10], [20, 0], [12, 7, 1])
    ]
    text = table_writer.diagnostics_text(clustered)
    assert "clusters 2/1/3" in text and "sizes 10+10 / 20 / 12+7+1" in text
    one = [{"method": "fedtsdp", **run_rows.diagnostics(rows([20], [0]), FedTSDP)}] * 3
    assert table_writer.diagnostics_text(one) == "clusters 1/1/1; triggers 0/0/0"


def test_uapdfl_reports_its_regimes_as_shares_of_peer_rounds_after_the_first() -> None:
    history = [{"round": 0}] + [
        {"round": r, "neighbours_mean": 2.0, "peers_dropout": d, "peers_partial": p,
         "peers_personal_head": h}
        for r, (d, p, h) in enumerate([(9, 9, 9), (1, 2, 1), (3, 0, 1)], start=1)
    ]  # fmt: skip
    figures = run_rows.diagnostics(history, UAPDFL)
    assert figures["regime_dropout"] == 0.5 and figures["regime_partial"] == 0.25
    assert figures["neighbours_mean"] == 2.0 and figures["clusters"] is None
    text = table_writer.diagnostics_text([{"method": "uapdfl", **figures}] * 2)
    assert text == "neighbours 2.0/2.0; regimes dropout+partial+head (%) 50+25+25 / 50+25+25"


def test_cluster_recovery_scores_the_partition_up_to_renaming() -> None:
    from tff_clustered.report import reporting

    planted = {"a": 0, "b": 0, "c": 1, "d": 1, "e": 2}
    renamed = reporting.cluster_recovery({"a": 2, "b": 2, "c": 0, "d": 0, "e": 1}, planted)
    assert renamed["adjusted_rand_vs_planted"] == 1.0 and renamed["planted_groups"] == 3
    assert renamed["cluster_sizes"] == [2, 1, 2] and renamed["clusters_in_use"] == 3
    one_model = reporting.cluster_recovery(dict.fromkeys(planted, 0), planted)
    assert one_model["adjusted_rand_vs_planted"] == 0.0 and one_model["clusters_in_use"] == 1
    # Clients without an assignment (-1) are left out; data without groups gives sizes only.
    mixed = reporting.cluster_recovery({"a": 0, "b": 1, "c": 1, "d": -1}, planted)
    assert mixed["cluster_sizes"] == [1, 2] and mixed["adjusted_rand_vs_planted"] < 0.5
    assert "adjusted_rand_vs_planted" not in reporting.cluster_recovery({"a": 0}, None)


def accuracy_rows(setting: str, algorithm: str, accuracies: list[float]) -> list[dict]:
    return [
        {"setting": setting, "algorithm": algorithm, "seed": seed, "final_accuracy": a}
        for seed, a in enumerate(accuracies)
    ]


def test_standings_measure_a_paper_method_against_the_better_baseline_and_fedavg() -> None:
    """FedTSDP 2 points under FedPer with stds of 1: below the better baseline; 1.5 points
    above FedAvg: above by more than one std. Level with FedPer within its std: level."""
    rows = (
        accuracy_rows("a", "fedavg", [0.80, 0.81, 0.82])
        + accuracy_rows("a", "fedper", [0.84, 0.85, 0.86])
        + accuracy_rows("a", "fedtsdp", [0.82, 0.83, 0.84])
        + accuracy_rows("b", "fedavg", [0.80, 0.80, 0.80])
        + accuracy_rows("b", "fedper", [0.84, 0.85, 0.86])
        + accuracy_rows("b", "fedtsdp", [0.84, 0.84, 0.84])
    )
    found = {s.setting: s for s in standings.standings(rows, "final_accuracy")}
    assert set(found) == {"a", "b"} and found["a"].best_reference == "fedper"
    assert round(found["a"].gap_to_best, 6) == -2.0 and round(found["a"].std_best, 6) == 1.0
    assert not found["a"].level_with_best and found["a"].above_single
    assert found["b"].level_with_best and found["b"].above_single
    table = "\n".join(standings.standing_table(list(found.values())))
    assert "-2.00 vs fedper (1.00): **below by more than one std**" in table
    # Decentralized tables compare with their own baselines; a table without FedAvg gives none.
    dfl = accuracy_rows("a", "fedavg_dfl", [0.9, 0.9]) + accuracy_rows("a", "uapdfl", [0.9, 0.91])
    (uapdfl,) = standings.standings(dfl, "final_accuracy")
    assert uapdfl.best_reference == "fedavg_dfl" and uapdfl.level_with_best
    assert not uapdfl.above_single
    assert standings.standings(accuracy_rows("a", "fedac", [0.9]), "final_accuracy") == []


def test_the_header_lists_the_table_defaults_a_command_took_and_the_regimes_per_seed(
    tmp_path: object,
) -> None:
    """comparison.md names the defaults its command did not give, with their source, under
    the command; the diagnostics, headed "per seed", give UA-PDFL's regimes per seed too."""
    history = [{"round": 0}] + [
        {"round": r, "accuracy": 0.5, "loss": 1.0, "client_accuracy_mean": 0.5,
         "floats_communicated": 1, "neighbours_mean": 3.0, "peers_dropout": d,
         "peers_partial": p, "peers_personal_head": h}
        for r, (d, p, h) in enumerate([(9, 9, 9), (1, 2, 1)], start=1)
    ]  # fmt: skip
    other_seed = [dict(r, peers_dropout=0) if r["round"] == 2 else r for r in history]
    rows = [
        run_rows.run_row("iid", "uapdfl", seed, h, 0.9, UAPDFL)
        for seed, h in enumerate([history, other_seed])
    ]
    taken = ["UA-PDFL Sec. 5.1: learning_rate=0.05", "the embedded digits' scale: rounds=20"]
    markdown = table_writer.write_tables(
        str(tmp_path), rows, "t", by_setting=True, client_mean=True, target_accuracy=0.9,
        command="python binaries/compare.py --table=uapdfl", date="d", defaults_taken=taken,
    )  # fmt: skip
    lines = markdown.splitlines()
    at = lines.index("- defaults of the flags not given:")
    assert lines[at - 1].startswith("- seeds: 0, 1") and lines[at + 1 : at + 4] == [
        "  - UA-PDFL Sec. 5.1: learning_rate=0.05",
        "  - the embedded digits' scale: rounds=20",
        "",
    ]
    assert lines[2] == "- command: `python binaries/compare.py --table=uapdfl`"
    # seed 0: 1/2/1 of 4 peer-rounds after round 1; seed 1: 0/2/1 of 3
    assert (
        "| iid | uapdfl | neighbours 3.0/3.0; regimes dropout+partial+head (%) 25+50+25 / 0+67+33 |"
        in lines
    ), lines


def test_a_table_records_its_cpu_and_numerics_settings_and_passes_the_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header names the CPU's numerics-relevant instruction sets and TensorFlow's oneDNN
    and thread settings (`numerics.machine_lines`), which `binaries/check_results.py` reads
    back; the rows a table is written from pass the checker's committed-row checks
    (`committed_tables`)."""
    cpuinfo = (
        "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f "
        "avx512_bf16 amx_tile\n\nprocessor\t: 1\nmodel name\t: Test CPU\n"
    )
    cpu = numerics.cpu_text(cpuinfo)
    assert cpu.startswith("Test CPU (") and cpu.endswith(
        "); sse4_2 avx avx2 fma avx512f avx512_bf16 amx_tile"
    )
    assert numerics.cpu_text("model name : Other\n").endswith("); flags not known")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    assert numerics.numerics_text("2.14.1", False).startswith(
        "TensorFlow 2.14.1, oneDNN off (TF_ENABLE_ONEDNN_OPTS=0, TF_NUM_INTRAOP_THREADS=1, "
        "TF_NUM_INTEROP_THREADS unset); "
    )
    machine = numerics.machine_lines()
    assert machine[0].startswith("- cpu: ") and machine[1].startswith("- numerics: TensorFlow ")
    history = [{"round": 0}] + [
        {"round": r, "accuracy": a, "loss": 1.0, "client_accuracy_mean": a}
        for r, a in enumerate([0.5, 0.75, 0.7], start=1)
    ]
    rows = [
        run_rows.run_row("iid", name, seed, history, 0.9, FedTSDP)
        for name in ("fedavg", "fedtsdp")
        for seed in (0, 1)
    ]
    for by_setting in (True, False):
        markdown = table_writer.write_tables(
            str(tmp_path), rows, "t", by_setting=by_setting, client_mean=False,
            target_accuracy=0.9, command="c", date="d", machine=machine,
        )  # fmt: skip
        assert numerics.machine_fields(markdown) == {
            "cpu": machine[0][len("- cpu: ") :],
            "numerics": machine[1][len("- numerics: ") :],
        }
        csv_text = (tmp_path / "comparison.csv").read_text()
        assert committed_tables.committed_problems(csv_text, markdown)[1] == []
        assert list(committed_tables.summary_cells(markdown))  # the summary is checked
