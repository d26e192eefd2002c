"""The toy speculative sampler of ../adapter_minimal is lossless: its pre-registered protocol, run by
the specval pytest plugin as a test of this suite, and the same protocol against a planted bug.

False-fail rate: the smoke profile has two p-valued gating families at alpha 0.01 on fixed seeds
(each session's fresh ledger starts at the protocol's seed_base), so the outcome is fixed on a
platform; a correct sampler fails a run with probability <= 0.02 over seed choices. The planted bug
is caught by the exact quadrature, which has no sampling error (deterministic).
"""

from pathlib import Path

import pytest
import yaml

PROTOCOL = "../adapter_minimal/protocol.yaml"  # relative to this file; frozen in its frozen.lock
PLANTED_BUG = "residual_from_p"  # one of the toy adapter's Capabilities.mutants


@pytest.mark.specval(PROTOCOL, profile="smoke")
def test_toy_sampler_is_lossless(specval_result):
    """The body runs only when the protocol PASSed; the plugin fails the test otherwise, naming the
    criteria that failed and the bundle. The result is there for further checks."""
    assert specval_result.mdes["t2_homogeneity.sync_vs_nospec"] < 0.2  # the smoke size resolves TV 0.2


def test_the_protocol_catches_a_planted_bug(specval_run, tmp_path):
    """The fixture form, with `check=False` (a non-PASS result is returned, not a failed test): the
    protocol with the adapter's planted bug switched on must FAIL, through the quadrature. The copy
    is not frozen, so it runs exploratory."""
    raw = yaml.safe_load((Path(__file__).parent / PROTOCOL).read_text())
    raw["sut"]["options"] = {"mutant": PLANTED_BUG}
    planted = tmp_path / "planted.yaml"
    planted.write_text(yaml.safe_dump(raw))
    result = specval_run(planted, profile="smoke", exploratory=True, check=False)
    assert result.verdict == "FAIL" and result.exploratory
    assert "quadrature.sync" in [criterion.name for criterion in result.failing], result.explain()
