"""The per-seed diagnostics of a comparison table: clusters in use, their sizes, triggers."""

from __future__ import annotations

from tff_clustered import result_tables


def rows(sizes: list[int], clustered: list[int]) -> list[dict]:
    history = [{"round": 0, **{f"cluster_size_{k}": 0.0 for k in range(len(sizes))}}]
    for r, flag in enumerate(clustered, start=1):
        row = {"round": r, "clustered": flag}
        row.update({f"cluster_size_{k}": float(v) for k, v in enumerate(sizes)})
        history.append(row)
    return history


def test_diagnostics_give_clusters_in_use_with_their_sizes_largest_first() -> None:
    d = result_tables.diagnostics(rows([5, 0, 28, 70], [0, 1, 0]), decentralized=False)
    assert d["clusters"] == 3 and d["cluster_sizes"] == "70+28+5" and d["triggers"] == 1
    peers = result_tables.diagnostics(rows([5, 5], [0]), decentralized=True)
    assert peers["clusters"] is None and peers["cluster_sizes"] is None


def test_sizes_are_shown_only_where_some_seed_formed_clusters() -> None:
    clustered = [
        result_tables.diagnostics(rows(s, [0]), decentralized=False)
        for s in ([10, 10], [20, 0], [12, 7, 1])
    ]
    text = result_tables.diagnostics_text(clustered)
    assert "clusters 2/1/3" in text and "sizes 10+10 / 20 / 12+7+1" in text
    one = [result_tables.diagnostics(rows([20], [0]), decentralized=False)] * 3
    assert result_tables.diagnostics_text(one) == "clusters 1/1/1; triggers 0/0/0"


def test_cluster_recovery_scores_the_partition_up_to_renaming() -> None:
    from tff_clustered import reporting

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
