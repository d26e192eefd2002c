"""Paired quality runs end to end with a scripted completion SUT: verdicts, bundle, verify, CLI.

The fake SUT answers each arithmetic item correctly or not as a pure function of (request seed,
group): the baseline is right with probability BASE_ACCURACY, and a group with `regression` r turns
each right answer wrong with probability r (paired, same seed). Everything is seeded, so every
outcome below is deterministic; the stated rates say how often a fresh seed would flip it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from specval import bundle as bundles
from specval.quality import runner as quality
from specval.cli import main
from specval.adapters.engine import Completion
from specval.protocol import ProtocolError, freeze
from specval.quality.protocol import load_quality_protocol
from specval.tasks.arith import evaluate

BASE_ACCURACY = 0.5
PROTOCOLS = Path(__file__).resolve().parents[3] / "protocols"
QUESTION = re.compile(r"What is ([0-9 +-]+)\?\nA:$")


def protocol_dict(num_items: int, regression: float = 0.0, margin: float = 0.1) -> dict:
    return {"kind": "quality", "name": "quality_fake", "sut": {"adapter": "engine", "options": {"regression": regression}},
            "task": {"name": "arith", "metric": "exact", "options": {"seed": 0}},
            "sampling": {"temperature": 0.7, "top_p": 0.95}, "num_speculative_tokens": 2, "max_tokens": 4,
            "groups": [{"name": "nospec", "mode": "nospec"}, {"name": "sync", "mode": "sync", "draft_loops": 1}],
            "baseline": "nospec", "num_items": num_items, "seeds_per_item": 2, "margin": margin, "alpha": 0.05,
            "batch_size": 50, "profiles": {"smoke": {"num_items": 3, "seeds_per_item": 1}}}


def write(tmp_path, raw: dict, name: str = "quality_fake.yaml"):
    """Write the protocol and freeze it next to itself (a pre-registered protocol runs without --exploratory)."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    freeze(path, load_quality_protocol)
    return path


class ScriptedSUT:
    """Answers right or wrong as a function of (seed, group); `regression` from sut.options."""

    def __init__(self, spec, num_speculative_tokens):
        self.regression = dict(spec.options).get("regression", 0.0)

    def check_groups(self, groups):
        pass

    def render_chat(self, messages):
        raise AssertionError("plain prompts only")

    def complete(self, group, prompts, sampling, seeds, max_tokens, progress=None):
        out = []
        for prompt, seed in zip(prompts, seeds):
            answer = evaluate(QUESTION.search(prompt).group(1))
            draws = np.random.default_rng([int(seed), 7]).random(2)
            right = draws[0] < BASE_ACCURACY and not (group.is_speculative and draws[1] < self.regression)
            out.append(Completion(f" {answer if right else answer + 1}\n\n", 3, 2, 1, "length"))
        return out

    def describe(self):
        return {"adapter": "ScriptedSUT"}

    def close(self):
        pass


def run(tmp_path, raw, profile=None):
    return quality.run(write(tmp_path, raw), profile, tmp_path / "results", progress=False,
                       sut_factory=ScriptedSUT, command=["test"])


def test_no_regression_passes_and_the_bundle_verifies(tmp_path):
    # 400 pairs, 0 discordant: the interval is [-x, +x] with x ~ 0.01 < margin 0.1 (a fresh seed
    # could not change this: the groups are identical by construction).
    path, summary = run(tmp_path, protocol_dict(200))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert (summary["verdict"], test["verdict"], test["role"]) == ("PASS", "PASS", "primary")
    assert test["wins"] == test["losses"] == 0 and test["ties"] == 400 and test["p_value"] == 1.0
    assert 0.4 < summary["groups"]["nospec"]["accuracy"] < 0.6
    assert quality.verify(path) == []
    report = (path / "report.md").read_text()
    assert "NOT evidence of no regression" in report and "noninferiority.sync_vs_nospec" in report


def test_tampered_completion_is_caught_by_verify(tmp_path):
    path, _ = run(tmp_path, protocol_dict(20))
    rows = bundles.read_json(path / "samples" / "sync.json")
    rows[0]["completion"] = " 999\n\n" if rows[0]["completion"] != " 999\n\n" else " 998\n\n"
    bundles.write_json(path / "samples" / "sync.json", rows)
    problems = quality.verify(path)
    assert any("samples/sync.json: sha256 differs" in p for p in problems)
    assert any(p.startswith("summary.json:") for p in problems)  # the re-scored summary differs too


def test_quality_samples_are_hashed_as_written_and_a_sealed_bundle_is_not_resumed(tmp_path):
    path, _ = run(tmp_path, protocol_dict(5))
    recorded = bundles.read_chunk_index(path)
    assert recorded == {f"samples/{g}.json": bundles.sha256_file(path / "samples" / f"{g}.json")
                        for g in ("nospec", "sync")}
    assert bundles.chain_problems(path, bundles.read_json(path / "chunks.json")) == []
    with pytest.raises(bundles.BundleError, match="a sealed bundle is never re-opened"):
        quality.run(None, None, tmp_path / "results", resume=path, progress=False, sut_factory=ScriptedSUT)
    (path / "SHA256SUMS").unlink()  # the laundering door: unseal, tamper, resume to re-seal
    bundles.write_json(path / "samples" / "sync.json", [])
    with pytest.raises(bundles.BundleError, match="the run recorded its verdict and is never collected into again"):
        quality.run(None, None, tmp_path / "results", resume=path, progress=False, sut_factory=ScriptedSUT)
    from specval import api  # `--resume` of a decided bundle only completes it: the chain refuses the edit

    with pytest.raises(bundles.BundleError, match="refusing to complete it.*samples/sync.json: sha256 differs"):
        api.resume(path)  # no system under test is needed to complete a bundle


def test_planted_regression_fails(tmp_path):
    # regression 0.4 on a 0.5-accurate baseline: true diff -0.2, 400 pairs; the 95% interval's upper
    # end lies below -0.1 unless the observed diff is ~2.5 standard errors off (rate < 1%).
    _, summary = run(tmp_path, protocol_dict(200, regression=0.4))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert summary["verdict"] == "FAIL" and test["verdict"] == "FAIL"
    assert test["losses"] > 0 and test["wins"] == 0 and test["ci_high"] < -0.1
    assert test["p_value"] < 1e-6


def test_wide_interval_is_inconclusive_not_pass(tmp_path):
    # 20 pairs with regression 0.1: the interval is ~+-0.15 wide around a small loss, so it must
    # straddle -0.1 (deterministic for these seeds; at this n it would for almost any seed).
    _, summary = run(tmp_path, protocol_dict(10, regression=0.1))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert test["ci_low"] < -0.1 < test["ci_high"]
    assert summary["verdict"] == "INCONCLUSIVE" and "not a PASS" in summary["reason"]


def test_cli_dispatches_quality_protocols_and_exits_4_when_inconclusive(tmp_path, monkeypatch):
    # 3 pairs: the interval cannot clear a 0.1 margin (deterministic for these seeds), so INCONCLUSIVE
    monkeypatch.setattr(quality, "open_sut", ScriptedSUT)
    file = write(tmp_path, protocol_dict(10, regression=0.1))
    result = CliRunner().invoke(main, ["run", str(file), "--profile", "smoke", "--output", str(tmp_path / "r"),
                                       "--quiet"])
    assert result.exit_code == 4 and "INCONCLUSIVE: non-inferiority not established" in result.output, result.output
    bundle = result.output.strip().splitlines()[-1].removeprefix("bundle: ")
    assert bundles.read_json(tmp_path / "r" / "ledger.json")["ranges"][0]["stop"] == 3  # 3 items x 1 seed
    verified = CliRunner().invoke(main, ["verify", bundle])
    assert verified.exit_code == 0 and "verifies" in verified.output


def test_same_seeds_in_every_group_and_fresh_seeds_per_run(tmp_path):
    first, _ = run(tmp_path, protocol_dict(5))
    second, _ = run(tmp_path, protocol_dict(5))
    seeds = [[r["seed"] for r in bundles.read_json(path / "samples" / f"{g}.json")]
             for path in (first, second) for g in ("nospec", "sync")]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3]
    assert not set(seeds[0]) & set(seeds[2])


@pytest.mark.parametrize("key, value, message", [
    ("margn", 0.1, "margn: unknown key; did you mean 'margin'"),
    ("baseline", "base", "baseline: must be one of"),
    ("margin", 1.5, "margin: must lie in (0, 1)"),
    ("task", {"name": "arith", "metric": "flexible_extract"}, "task.metric: must be one of ['exact']"),
    ("task", {"name": "arith", "metric": "exact", "options": {"num_digit": 2}}, "did you mean 'num_digits'"),
    ("task", {"name": "arith", "metric": "exact", "options": {"num_digits": 0}}, "num_digits"),
    ("profiles", {"smoke": {"samples_per_group": 3}}, "a profile may only set"),
])
def test_bad_protocol_names_key_and_value(tmp_path, key, value, message):
    raw = protocol_dict(5)
    raw[key] = value
    with pytest.raises(ProtocolError, match=re.escape(message)):
        load_quality_protocol(write(tmp_path, raw))


def test_shipped_quality_protocols_parse():
    for name in ("quality_arith", "quality_gsm8k"):
        protocol = load_quality_protocol(PROTOCOLS / f"{name}.yaml")
        assert protocol.sut.model == "smollm2" and protocol.baseline == "nospec"
        assert [role for role, _, _ in protocol.comparisons()] == ["primary", "primary", "secondary"]


def test_cli_validates_and_freezes_quality_protocols(tmp_path):
    """`validate` and `freeze` parse a quality protocol with its own schema: the shipped ones are
    frozen, a copy freezes into its own lock, and a changed value is reported as changed."""
    runner = CliRunner()
    shipped = runner.invoke(main, ["validate", str(PROTOCOLS / "quality_arith.yaml"),
                                   str(PROTOCOLS / "quality_gsm8k.yaml")])
    assert shipped.exit_code == 0, shipped.output
    assert shipped.output.count("(frozen)") == 2
    copy = tmp_path / "quality_fake.yaml"
    copy.write_text(yaml.safe_dump(protocol_dict(num_items=4)))
    frozen = runner.invoke(main, ["freeze", str(copy)])
    assert frozen.exit_code == 0, frozen.output
    assert "quality_fake" in (tmp_path / "frozen.lock").read_text()
    copy.write_text(yaml.safe_dump(protocol_dict(num_items=5)))
    changed = runner.invoke(main, ["validate", str(copy)])
    assert changed.exit_code == 1 and "changed since frozen" in changed.output
