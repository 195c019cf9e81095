"""Algorithms with models: `binaries/model_matrix.py` runs every pair for one round on tiny data
(tens of minutes, outside the suite); here the pairs that once failed run through it."""

from __future__ import annotations

from conftest import run_binary


def test_pairs_that_failed_once_run_or_are_refused_with_the_fix() -> None:
    done = run_binary(["binaries/model_matrix.py", "--pairs=uapdfl:cnn,fedac:mclr,uapdfl:lstm"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # UA-PDFL's peer step called the CNN's Keras Reshape layer, unusable once TFF had built
    # a model in a TF1 graph ("Your Layer or Model is in an invalid state").
    assert any(" cnn " in line and " uapdfl " in line and " ok " in line for line in lines)
    # FedAC pulls the embedding (all but the last layer); MCLR has none.
    assert any(
        " mclr " in line and "refused" in line and "--fedac_lambda=0" in line for line in lines
    ), done.stdout
    # UA-PDFL reads g's output (I^Aux): once refused with the LSTM, which went through TFF's
    # functional model (no intermediate values); the interpreter now runs it.
    assert any(" lstm " in line and " uapdfl " in line and " ok " in line for line in lines)
    assert "0 cell(s) failed, 1 refused" in done.stdout
