"""bench ddp: two processes train the MLP with tppasm kernels under DistributedDataParallel (gloo)
and follow plain torch's loss curve."""
import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

from bench import ddp_mlp  # noqa: E402


def test_two_ranks_follow_torch(capsys):
    args = ddp_mlp.parse(["--ranks", "2", "--steps", "3", "--batch", "16", "--width", "24", "--layers", "3",
                          "--lr", "0.01"])
    result = ddp_mlp.spawn(args)
    assert result["world"] == 2 and result["threads"] >= 1
    # gloo's workers were joined before the rank's interpreter finalized (left running, one of them
    # could still be dropping an all-reduce there and abort the process: SIGABRT, now and then)
    assert result["gloo_threads_left"] == 0
    ours, theirs = result["losses"]["tppasm"], result["losses"]["torch"]
    assert len(ours) == len(theirs) == 3 and ours[-1] < ours[0]          # it learns...
    assert ddp_mlp.max_relative_difference(ours, theirs) <= ddp_mlp.TOLERANCE["f32"]    # ...as torch does
    assert ddp_mlp.report(result, args)
    out = capsys.readouterr().out
    assert "loss tppasm | loss torch" in out and "ms/step" in out


def test_a_different_curve_fails_the_run():
    args = ddp_mlp.parse(["--steps", "2"])
    result = {"world": 2, "threads": 1, "losses": {"tppasm": [1.0, 0.9], "torch": [1.0, 0.8]},
              "step_s": {"tppasm": 0.01, "torch": 0.01}}
    with pytest.raises(SystemExit, match="differs from torch's"):
        ddp_mlp.report(result, args)
