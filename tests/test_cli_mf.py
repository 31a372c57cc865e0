"""The command line's correlated-noise DP: --mechanism, --bands, --adaptive-clip (issue 34)."""

import json
import math

import numpy as np
import pytest

from jaxwise.cli import main
from jaxwise.data import make_blobs

dp_accounting = pytest.importorskip("dp_accounting")

SPIRAL_TRAIN = 1440  # 3 arms of 600 points, 80% for training
SPIRAL_STEPS = 3 * round(SPIRAL_TRAIN / 128)  # --epochs 3 at the default batch of 128


def run_cli(args, capsys):
    code = main([*args, "--no-progress", "--no-cache"])
    out, err = capsys.readouterr()
    return code, out, err


def spiral(capsys, tmp_path, *options):
    args = ["spiral", "--dp", "--epochs", "3", "--no-plots", "--json", "--out", str(tmp_path)]
    code, out, err = run_cli([*args, *options], capsys)
    assert code == 0, err
    return json.loads(out)


def amplified_bandmf_epsilon(sigma, q, steps, bands):
    """dp-accounting's RDP ε of DP-SGD's Poisson event over ceil(steps / bands) compositions."""
    acc = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, math.ceil(steps / bands)))
    return acc.get_epsilon(1e-5)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_spiral_bandmf_reports_its_mechanism_and_amplified_epsilon(tmp_path, capsys):
    summary = spiral(capsys, tmp_path, "--mechanism", "bandmf", "--bands", "4")
    dp = summary["dp"]
    assert summary["compiles"] == 1 and summary["ok"]
    assert (dp["mechanism"], dp["bands"], dp["groups"], dp["sampling"]) == (
        "bandmf",
        4,
        4,
        "cyclic_poisson",
    )
    q = 128 / (SPIRAL_TRAIN // 4)  # the rate of a step's group
    assert dp["sample_rate"] == pytest.approx(q) and dp["steps"] == SPIRAL_STEPS
    expected = amplified_bandmf_epsilon(1.1, q, SPIRAL_STEPS, 4)
    assert dp["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert 0 < dp["expected_error_vs_dpsgd"] < 1  # BandMF(4) beats DP-SGD at the same ε


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_spiral_auto_keeps_dpsgds_epsilon_and_never_loses_to_it(tmp_path, capsys):
    from jaxwise import privacy

    summary = spiral(capsys, tmp_path, "--mechanism", "auto")
    dp = summary["dp"]
    assert dp["mechanism_option"] == "auto" and dp["mechanism"] in ("dpsgd", "bandmf", "blt")
    assert dp["expected_error_vs_dpsgd"] <= 1.0
    dpsgd = privacy.epsilon(
        noise_multiplier=1.1, sample_rate=128 / SPIRAL_TRAIN, steps=SPIRAL_STEPS, delta=1e-5
    )
    # σ calibrated to DP-SGD's ε (bisection to 1e-4): the same ε, never more than a hair above
    assert dp["epsilon"] == pytest.approx(dpsgd, rel=1e-3)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_spiral_blt_with_adaptive_clip_counts_the_count_in_epsilon(tmp_path, capsys):
    from jaxwise import privacy

    summary = spiral(capsys, tmp_path, "--mechanism", "blt", "--adaptive-clip")
    dp = summary["dp"]
    assert summary["compiles"] == 1 and summary["ok"]
    assert (dp["mechanism"], dp["buffers"], dp["bands"]) == ("blt", 2, None)
    assert dp["adaptive_clip"] == {"target_quantile": 0.5}
    groups = SPIRAL_TRAIN // 128
    blt = privacy.BLT(buffers=2, steps=SPIRAL_STEPS, min_sep=groups)
    fixed = privacy.epsilon(
        noise_multiplier=1.1, sample_rate=1.0, steps=SPIRAL_STEPS, delta=1e-5, mechanism=blt
    )
    assert dp["epsilon"] > fixed  # the noised count is a second release


def test_spiral_bandmf_audit_bound_is_below_epsilon(tmp_path, capsys):
    summary = spiral(capsys, tmp_path, "--mechanism", "bandmf", "--bands", "2", "--audit", "200")
    dp = summary["dp"]
    assert dp["mechanism"] == "bandmf" and dp["canaries"] == 200
    assert 0 <= dp["epsilon_audit_lower_bound"] <= dp["epsilon"]


@pytest.mark.parametrize(
    "options, message",
    [
        (["--bands", "4"], "--bands needs --dp"),
        (["--mechanism", "bandmf"], "--mechanism needs --dp"),
        (["--adaptive-clip"], "--adaptive-clip needs --dp"),
        (["--dp", "--mechanism", "bandmf", "--bands", "0"], "--bands must be >= 1"),
        (["--dp", "--mechanism", "bandmf", "--bands", "40"], "--bands 40 exceeds the run's 33"),
        (["--dp", "--mechanism", "bandmf", "--bands", "12"], "needs 1536 training examples"),
        (["--dp", "--mechanism", "blt", "--bands", "3"], "it needs --mechanism bandmf"),
        (["--dp", "--bands", "3"], "it needs --mechanism bandmf"),
        (["--dp", "--adaptive-clip", "1.5"], "--adaptive-clip must be < 1.0"),
        (["--dp", "--adaptive-clip", "0"], "--adaptive-clip must be > 0.0"),
        (["--dp", "--mechanism", "auto", "--noise-multiplier", "0"], "--noise-multiplier > 0"),
    ],
)
def test_bad_dp_options_exit_2_naming_the_option(tmp_path, capsys, options, message):
    args = ["spiral", "--epochs", "3", "--no-plots", "--out", str(tmp_path), *options]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_mechanism_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["spiral", "--dp", "--mechanism", "matrix"])
    assert info.value.code == 2 and "--mechanism" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# jaxwise train: the noise buffers are checkpointed; resume refuses another mechanism
# ---------------------------------------------------------------------------


@pytest.fixture
def blob_csv(tmp_path):
    x, y = make_blobs(600, 6, 3, seed=0)
    path = tmp_path / "blobs.csv"
    lines = [",".join([f"f{i}" for i in range(6)] + ["y"])]
    lines += [",".join([*(f"{v:.6f}" for v in row), str(int(c))]) for row, c in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_train_bandmf_resume_is_bit_identical_and_other_mechanisms_are_refused(
    tmp_path, blob_csv, capsys
):
    common = ["train", str(blob_csv), "--label", "y", "--epochs", "4", "--batch-size", "32"]
    dp = ["--dp", "--mechanism", "bandmf", "--bands", "3", "--adaptive-clip", "--json"]
    a = ["--out", str(tmp_path / "a"), "--no-plots"]
    code, straight, err = run_cli([*common, *dp, *a], capsys)
    assert code == 0, err
    b = ["--out", str(tmp_path / "b"), "--no-plots"]
    assert run_cli([*common, *dp, *b, "--stop-after", "2"], capsys)[0] == 0
    for other, name in (
        (["--dp", "--json"], "mechanism"),
        (["--dp", "--mechanism", "bandmf", "--bands", "2", "--adaptive-clip"], "bands"),
        (["--dp", "--mechanism", "bandmf", "--bands", "3"], "adaptive_clip"),
    ):
        code, _, err = run_cli([*common, *other, *b, "--resume"], capsys)
        assert code == 2 and f"--resume: the checkpoint was trained with {name}=" in err
    code, resumed, err = run_cli([*common, *dp, *b, "--resume"], capsys)
    assert code == 0, err
    first, second = json.loads(straight), json.loads(resumed)
    assert second["resumed_from_epoch"] == 2 and second["epochs_completed"] == 4
    assert first["params_sha256"] == second["params_sha256"]  # the buffers and clip resumed
    assert first["dp"]["epsilon"] == second["dp"]["epsilon"]
    assert np.isfinite(first["dp"]["epsilon"]) and first["dp"]["bands"] == 3


def test_spiral_table_names_the_noise(tmp_path, capsys):
    pytest.importorskip("rich")
    args = ["spiral", "--dp", "--epochs", "2", "--no-plots", "--out", str(tmp_path)]
    code, out, err = run_cli([*args, "--mechanism", "bandmf", "--bands", "2"], capsys)
    assert code == 0, err
    row = [line for line in out.splitlines() if "privacy noise" in line]
    assert row and "BandMF, 2 bands" in row[0]  # a long cell wraps onto the next lines
