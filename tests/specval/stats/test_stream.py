"""The Monte Carlo stream: each transform against a scalar reference written from its
specification (specval/stats/stream.py), the words each method consumes, golden values and
golden p-values of criteria, and the legacy stream of old bundles.

Deterministic (fixed keys) except where a law is checked; those state their false-fail rates.
The golden values were printed by this implementation (numpy 2.4, scipy 1.17, x86_64); they are
the specification in numbers: a change of any of them breaks the verification of every bundle
sealed with this stream, so it must never happen silently.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specval.stats import montecarlo
from specval.stats import stream as stream_module
from specval.stats.independence import pit_association
from specval.stats.sequence import pit_uniformity, serial_dependence
from specval.stats.strata import stratified_gof, stratified_homogeneity
from specval.stats.stream import CHUNK_WORDS, STREAM_NAME, Stream

KEY = 0x0123456789ABCDEF_FEDCBA9876543210


def _words(key: int, n: int, skip: int = 0) -> np.ndarray:
    return np.random.Philox(key=key).random_raw(skip + n)[skip:]


def _unit(word: int) -> float:
    return (int(word) >> 11) * 2.0**-53


# ---------------------------------------------------------------- each transform against its specification


def test_uniforms_are_the_top_53_bits_of_consecutive_words():
    stream = Stream(KEY)
    first, second = stream.random(5), stream.random((2, 3))
    words = _words(KEY, 11)
    assert first.tolist() == [_unit(w) for w in words[:5]]
    assert second.tolist() == np.array([_unit(w) for w in words[5:]]).reshape(2, 3).tolist()
    assert isinstance(Stream(KEY).random(), float)


def _integers_reference(key: int, low: int, high: int, count: int) -> tuple[list[int], int]:
    """Lemire's rule word by word: (values, words consumed)."""
    span, out = high - low, []
    threshold = (2**32 - span) % span
    for used, word in enumerate(_words(key, 4 * count + 64), start=1):
        product = (int(word) >> 32) * span
        if product % 2**32 >= threshold:
            out.append(low + product // 2**32)
            if len(out) == count:
                return out, used
    raise AssertionError("more rejections than words drawn")


@pytest.mark.parametrize("low,high", [(0, 3), (-5, 7), (0, 2**32), (10, 11), (0, 2**31 + 12345)])
def test_integers_follow_lemire_and_consume_exactly_the_words_tried(low, high):
    stream = Stream(KEY)
    values = stream.integers(low, high, size=(40, 5))
    expected, used = _integers_reference(KEY, low, high, 200)
    assert values.reshape(-1).tolist() == expected
    assert stream.raw(1)[0] == _words(KEY, 1, skip=used)[0]  # the next word is the one after the last tried


def _multinomial_reference(key: int, trials: list[int], pvals: np.ndarray) -> list[list[int]]:
    cdf, last = np.cumsum(pvals), int(np.flatnonzero(pvals > 0)[-1])
    words, out, used = _words(key, sum(trials)), [], 0
    for n in trials:
        counts = [0] * pvals.size
        for word in words[used : used + n]:
            counts[min(int(np.searchsorted(cdf, _unit(word) * cdf[-1], side="right")), last)] += 1
        used += n
        out.append(counts)
    return out


def test_multinomial_is_categorical_draws_in_cell_order():
    pvals = np.array([0.2, 0.0, 0.5, 0.3, 0.0])
    trials = np.array([7, 0, 30])
    counts = Stream(KEY, version=2).multinomial(trials, pvals, size=(2, 3))
    assert counts.shape == (2, 3, 5) and counts.dtype == np.int64
    assert counts.reshape(6, 5).tolist() == _multinomial_reference(KEY, [7, 0, 30] * 2, pvals)
    assert (counts[..., [1, 4]] == 0).all() and (counts.sum(axis=-1) == trials).all()
    assert (
        Stream(KEY, version=2).multinomial(9, [1.0, 3.0]).tolist()
        == _multinomial_reference(KEY, [9], np.array([0.25, 0.75]))[0]
    )


def test_multinomial_chunks_do_not_change_the_draws():
    trials = np.full(3, CHUNK_WORDS // 2 + 1)  # three chunks of one cell each
    counts = Stream(KEY, version=2).multinomial(trials, [0.5, 0.5])
    words = _words(KEY, int(trials.sum()))
    below = (np.array([_unit(w) for w in words[:: 1 << 16]]) < 0.5).mean()  # a thinned look: it is a fair coin
    assert (counts.sum(axis=1) == trials).all() and 0.4 < below < 0.6
    assert counts[1, 0] == int(
        ((words[trials[0] : 2 * trials[0]] >> np.uint64(11)).astype(np.float64) * 2.0**-53 < 0.5).sum()
    )


def _hypergeometric_reference(key: int, colors: list[int], nsample: int, rows: int) -> list[list[int]]:
    total, out = sum(colors), []
    words = _words(key, rows * total)
    owner = np.repeat(np.arange(len(colors)), colors)
    for row in range(rows):
        keys = words[row * total : (row + 1) * total]
        order = sorted(range(total), key=lambda i: (int(keys[i]), i))[:nsample]
        out.append(np.bincount(owner[order], minlength=len(colors)).tolist())
    return out


@pytest.mark.parametrize("colors,nsample", [([5, 0, 7, 3], 6), ([1, 1], 2), ([4, 9], 0), ([30, 10, 60], 20)])
def test_hypergeometric_takes_the_items_of_smallest_words(colors, nsample):
    counts = Stream(KEY, version=2).multivariate_hypergeometric(np.array(colors), nsample, size=7, method="marginals")
    assert counts.tolist() == _hypergeometric_reference(KEY, colors, nsample, 7)


def test_ties_at_the_cut_are_taken_in_item_order():
    from specval.stats.stream import _smallest

    keys = np.array([[5, 3, 3, 3, 9]], dtype=np.uint64)
    assert _smallest(keys, 2).tolist() == [[False, True, True, False, False]]


@pytest.mark.parametrize("version", [2, 3])
def test_the_laws_are_right(version):
    """Chi-square checks of each transform's law at 2e5 draws, fixed keys; each at level 1e-4, so
    with fresh keys the test fails with probability <= 3e-4 per version when the transforms are
    right. A transform off by a TV of 0.01 fails with probability > 0.999 (noncentrality >= 4 n
    TV^2 = 80). Version 3's tables are checked further in test_variates.py."""
    n = 200_000
    ints = np.bincount(Stream(1, version=version).integers(0, 7, size=n), minlength=7)
    pvals = np.array([0.1, 0.2, 0.3, 0.4])
    multi = Stream(2, version=version).multinomial(n, pvals)
    hyper = Stream(3, version=version).multivariate_hypergeometric(np.array([6, 3, 1]), 4, size=n // 10)
    law = stats.multivariate_hypergeom.pmf
    cells = [(a, b, 4 - a - b) for a in range(5) for b in range(4) if 0 <= 4 - a - b <= 1]
    seen = dict.fromkeys(cells, 0)
    for row in map(tuple, hyper.tolist()):
        seen[row] += 1
    expected = np.array([law(x=list(c), m=[6, 3, 1], n=4) for c in cells]) * len(hyper)
    for observed, mean in ((ints, np.full(7, n / 7)), (multi, n * pvals), (np.array(list(seen.values())), expected)):
        assert stats.chisquare(observed, mean).pvalue > 1e-4


# ---------------------------------------------------------------- golden values: the stream in numbers


GOLDEN_UNIFORMS = [0.2914952779168142, 0.7327299909700856, 0.6703110429158319, 0.47349663233274286]


def test_golden_uniforms():
    assert Stream(KEY).random(4).tolist() == GOLDEN_UNIFORMS


def _criteria(stream: str) -> dict[str, tuple[float, int]]:
    """(p-value, draws) of four criteria on fixed data, each keyed as the summary keys it."""
    data = np.random.default_rng(7)  # the data only: it is not the stream under test
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    strata = [
        (("a",), data.multinomial(300, [0.43, 0.3, 0.17, 0.1]), probs),
        (("b",), data.multinomial(200, probs), probs),
    ]
    gof = stratified_gof(
        strata,
        stratum_min=50,
        min_expected=5.0,
        level=0.002,
        rng=montecarlo.criterion_rng("golden", "gof", stream=stream),
    )
    split = [(("a",), data.multinomial(300, probs), data.multinomial(300, [0.35, 0.35, 0.2, 0.1]), probs)]
    homogeneity = stratified_homogeneity(
        split,
        stratum_min=50,
        min_expected=5.0,
        level=0.002,
        rng=montecarlo.criterion_rng("golden", "homogeneity", stream=stream),
    )
    u = data.random(400) ** 1.1
    pit = pit_uniformity(u, level=0.002, rng=montecarlo.criterion_rng("golden", "pit", stream=stream))
    serial = serial_dependence(
        [u[:200], u[200:]], 2, level=0.002, rng=montecarlo.criterion_rng("golden", "serial", stream=stream)
    )
    pair = pit_association(
        u[:200], data.random(200), level=0.002, rng=montecarlo.criterion_rng("golden", "pair", stream=stream)
    )
    off = stratified_gof(
        [(("c",), data.multinomial(400, [0.55, 0.25, 0.1, 0.1]), probs)],
        stratum_min=50,
        min_expected=5.0,
        level=0.02,
        rng=montecarlo.criterion_rng("golden", "off", stream=stream),
    )
    return {
        "gof": (gof.p_value, gof.mc.draws),
        "homogeneity": (homogeneity.p_value, homogeneity.mc.draws),
        "rejected_gof": (off.p_value, off.mc.draws),
        "pit": (pit.p_value, pit.mc.draws),
        "serial": (serial.p_value, serial.mc.draws),
        "pair": (pair.p_value, pair.mc_rho.draws + pair.mc_chi2.draws),
    }


GOLDEN_P_VALUES = {  # (p-value, null draws): exact rationals k / L or (k + 1) / (B + 1)
    "gof": (30 / 101, 101),
    "homogeneity": (30 / 104, 104),
    "rejected_gof": (1 / 1501, 1500),
    "pit": (30 / 58, 58),
    "serial": (30 / 73, 73),
    "pair": (0.9836065573770492, 112),
}


def test_golden_p_values_of_criteria():
    """Version 1's golden values (the stream of bundles sealed before version 2): unchanged."""
    assert _criteria(montecarlo.FIRST_STREAM) == GOLDEN_P_VALUES


GOLDEN_P_VALUES_V2 = GOLDEN_P_VALUES | {  # the sequence criteria draw packed digits; the others as version 1
    "pit": (30 / 64, 64),
    "serial": (30 / 76, 76),
    "pair": (1.0, 102),
}


def test_golden_p_values_of_criteria_version_2():
    assert montecarlo.SECOND_STREAM == "philox4x64-10/specval-2"
    assert _criteria(montecarlo.SECOND_STREAM) == GOLDEN_P_VALUES_V2


GOLDEN_P_VALUES_V3 = GOLDEN_P_VALUES_V2 | {  # the tables draw conditional variates; the rest as version 2
    "gof": (30 / 107, 107),
    "homogeneity": (30 / 109, 109),
    "rejected_gof": (1 / 1501, 1500),
}


def test_golden_p_values_of_criteria_version_3():
    assert STREAM_NAME == "philox4x64-10/specval-3" == montecarlo.CURRENT_STREAM
    assert _criteria(STREAM_NAME) == GOLDEN_P_VALUES_V3


def test_the_legacy_stream_is_numpy_pcg64_seeded_as_before():
    legacy = montecarlo.criterion_rng("hash", "t2_gof.sync", "sync:0-3000", stream=montecarlo.LEGACY_STREAM)
    import hashlib

    digest = hashlib.sha256("\x1f".join(["hash", "t2_gof.sync", "sync:0-3000"]).encode()).digest()
    old = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int.from_bytes(digest[:16], "little"))))
    assert legacy.random(5).tolist() == old.random(5).tolist()
    with pytest.raises(ValueError, match="unknown Monte Carlo stream"):
        montecarlo.criterion_rng("x", stream="mt19937")


# ---------------------------------------------------------------- the first stream, pinned before the second existed

FIRST_STREAM = "philox4x64-10/specval-1"  # kept bundles record it (reports/README.md)
PINNED_FIRST_STREAM = {  # (p-value, draws, exceedances) of the specval-1 stream, computed before specval-2 existed
    "pit": (18 / 1501, 1500, 17),
    "serial": (14 / 1501, 1500, 13),
    "pair_rho": (8 / 1501, 1500, 7),
    "pair_chi2": (11 / 1501, 1500, 10),
}


def _near_rejected(stream: str) -> dict[str, tuple[float, int, int]]:
    """Three sequence criteria whose p-values sit between 1 / (B + 1) and h / B (B = 1500): every null
    statistic near the observed one moves the exceedance count, so the pin holds the draws themselves."""

    def rng(name):
        return montecarlo.criterion_rng("pinned", name, stream=stream)

    u = np.random.default_rng(2).random(3000) ** 1.1
    pit = pit_uniformity(u, np.arange(3000) % 3, level=0.02, rng=rng("pit"))
    x = np.random.default_rng(0).random(3001)
    u = 0.9 * x[1:] + 0.1 * x[:-1]
    serial = serial_dependence([u[:1000], u[1000:2200], u[2200:]], 3, level=0.02, rng=rng("serial"))
    data = np.random.default_rng(3)
    a = data.random(2000)
    b = np.clip(0.94 * data.random(2000) + 0.06 * a, 0, 1)
    pair = pit_association(a, b, level=0.04, rng=rng("pair"))
    return {
        name: (mc.p_value, mc.draws, mc.exceedances)
        for name, mc in (("pit", pit.mc), ("serial", serial.mc), ("pair_rho", pair.mc_rho), ("pair_chi2", pair.mc_chi2))
    }


def test_the_first_stream_redraws_sequence_criteria_as_before():
    """Bundles that record specval-1 redraw their sequence nulls with its algorithm, bit for bit."""
    assert _near_rejected(FIRST_STREAM) == PINNED_FIRST_STREAM


# ---------------------------------------------------------------- version 2: packed uniform digits


def _digits_reference(key: int, base: int, rows: int, width: int) -> tuple[list[list[int]], int]:
    """uniform_digits by its specification, a word and a field at a time: (rows of digits, words used)."""
    digits = {10: 3, 5: 3}[base]
    values = base**digits
    bits = (values - 1).bit_length()
    words, used, out = _words(key, 4 * rows * width), 0, []
    for _ in range(rows):
        row = []
        while len(row) < width:
            word = int(words[used])
            used += 1
            for j in range(64 // bits):
                field = (word >> (bits * j)) & ((1 << bits) - 1)
                if field < values and len(row) < width:
                    row.extend(field // base ** (digits - 1 - i) % base for i in range(digits))
            row = row[:width] if len(row) >= width else row
        out.append(row[:width])
    return out, used


@pytest.mark.parametrize("base,rows,width", [(10, 3, 50), (5, 4, 61), (10, 1, 1), (5, 2, 300)])
def test_uniform_digits_follow_their_specification_and_consume_whole_words(base, rows, width):
    expected, used = _digits_reference(KEY, base, rows, width)
    stream = Stream(KEY, version=2)
    assert stream.uniform_digits(base, (rows, width)).tolist() == expected
    assert int(stream.raw(1)[0]) == int(_words(KEY, 1, skip=used)[0])  # the next word is the first unused one


def test_uniform_digits_packing_is_the_densest_of_the_rule():
    from specval.stats.stream import _packing

    assert _packing(10)[:2] == (3, 10)  # 6 fields of 3 digits a word, 1000 / 1024 accepted: 17.6 digits a word
    assert _packing(5)[:2] == (3, 7)  # 9 fields of 3 digits a word, 125 / 128 accepted: 26.4 digits a word
    assert _packing(2)[:2] == (1, 1)  # a power of two: every bit a digit
    with pytest.raises(ValueError, match="base"):
        _packing(257)


def test_uniform_digits_rows_do_not_depend_on_how_many_one_call_draws():
    whole = Stream(KEY).uniform_digits(10, (7, 333))
    stream = Stream(KEY)
    parts = [stream.uniform_digits(10, (rows, 333)) for rows in (1, 4, 2)]
    assert np.array_equal(np.concatenate(parts), whole)
    mixed = Stream(KEY)  # other methods in between take the words that follow, in order
    first, uniforms, rest = mixed.uniform_digits(10, (3, 333)), mixed.random(5), mixed.uniform_digits(10, (4, 333))
    assert np.array_equal(first, whole[:3]) and not np.array_equal(rest, whole[3:])
    assert uniforms.size == 5


def test_uniform_digits_across_chunks(monkeypatch):
    whole = Stream(KEY).uniform_digits(5, (40, 100))
    monkeypatch.setattr(stream_module, "CHUNK_WORDS", 16)  # a few rows a chunk, and words drawn short
    assert np.array_equal(Stream(KEY).uniform_digits(5, (40, 100)), whole)


def test_uniform_digit_counts_count_the_digits_of_each_segment():
    sizes = [5, 7, 1, 0, 11, 300, 2]
    digits = Stream(KEY).uniform_digits(10, (9, sum(sizes)))
    ends = np.cumsum([0] + sizes)
    expected = [[np.bincount(row[a:b], minlength=10) for a, b in zip(ends[:-1], ends[1:])] for row in digits]
    assert np.array_equal(Stream(KEY).uniform_digit_counts(10, sizes, 9), np.array(expected))


def test_uniform_digits_are_uniform_and_independent():
    # Deterministic (fixed key): 600,000 digits per base; their counts and the counts of adjacent
    # pairs against uniform, chi-square p > 1e-4 (a correct transform fails w.p. 2e-4 per key).
    for base in (10, 5):
        values = Stream(KEY).uniform_digits(base, (60, 10_000)).astype(np.int64)
        assert stats.chisquare(np.bincount(values.reshape(-1), minlength=base)).pvalue > 1e-4
        pairs = values[:, :-1] * base + values[:, 1:]
        assert stats.chisquare(np.bincount(pairs.reshape(-1), minlength=base * base)).pvalue > 1e-4


def test_version_1_has_no_uniform_digits_and_versions_are_named():
    with pytest.raises(ValueError, match="version 2"):
        Stream(KEY, version=1).uniform_digits(10, (1, 5))
    with pytest.raises(ValueError, match="version"):
        Stream(KEY, version=4)
    assert isinstance(montecarlo.criterion_rng("x", stream=montecarlo.FIRST_STREAM), Stream)
    assert montecarlo.criterion_rng("x", stream=montecarlo.FIRST_STREAM).version == 1
    assert montecarlo.criterion_rng("x", stream=montecarlo.SECOND_STREAM).version == 2
    assert montecarlo.criterion_rng("x").version == 3
    # the transforms of version 1 draw the same values under versions 2 and 3
    for version in (1, 2, 3):
        stream = Stream(KEY, version=version)
        assert stream.random(4).tolist() == GOLDEN_UNIFORMS


GOLDEN_DIGITS = {10: [5, 8, 0, 3, 5, 1, 3, 7, 3, 2, 4, 6], 5: [2, 3, 3, 4, 4, 4, 3, 2, 0, 2, 1, 3]}


def test_golden_digits():
    assert {base: Stream(KEY).uniform_digits(base, 12).tolist() for base in (10, 5)} == GOLDEN_DIGITS


# Size of the version-2 nulls: 1,000 replicates of each criterion on exact i.i.d. uniforms, each
# keyed like a bundle's criterion; the rejections at 0.05 must have a Clopper-Pearson 99.9% interval
# containing 0.05 or lying below it (a test of exact size fails w.p. <= 0.0005 per criterion; a
# size of 0.075 fails it w.p. > 0.9). The same checks of version 1 and of numpy's generator are
# tests/specval/stats/test_sequence.py and test_independence.py.
SIZE_REPS, SIZE_ALPHA = 1000, 0.05


def _assert_size(p_values) -> None:
    rejections = int((np.asarray(p_values) <= SIZE_ALPHA).sum())
    low = stats.beta.ppf(0.0005, rejections, len(p_values) - rejections + 1) if rejections else 0.0
    assert low <= SIZE_ALPHA, f"{rejections} / {len(p_values)} rejections at {SIZE_ALPHA}"


def test_version_2_sequence_nulls_have_exact_size():
    u = np.random.default_rng(21).random((SIZE_REPS, 2, 160))
    rng = montecarlo.criterion_rng
    _assert_size(
        [
            pit_uniformity(x[0], np.arange(160) % 5, level=SIZE_ALPHA, rng=rng("size", "pit", str(i))).p_value
            for i, x in enumerate(u)
        ]
    )
    _assert_size(
        [
            serial_dependence([x[0][:70], x[0][70:]], 4, level=SIZE_ALPHA, rng=rng("size", "serial", str(i))).p_value
            for i, x in enumerate(u)
        ]
    )
    _assert_size(
        [
            pit_association(x[0], x[1], level=SIZE_ALPHA, rng=rng("size", "pair", str(i))).mc_chi2.p_value
            for i, x in enumerate(u)
        ]
    )
