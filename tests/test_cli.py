"""``python -m disc demo``, the README's main job: compiles once, runs a shape stream against eager,
then saves the program and runs it again through the standalone runtime."""

from __future__ import annotations

from disc.cli import demo


def test_the_demo_compiles_once_matches_eager_and_deploys(capsys) -> None:
    assert demo("bert", "tiny", repeats=1) == 0  # nonzero when eager or the deployed program disagree
    out = capsys.readouterr().out
    assert "compilations: 1" in out
    assert "deployed: saved, loaded by disc_runtime (numpy only)" in out
