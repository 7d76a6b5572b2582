"""Approximate randomization, Holm, p text and limits (src/r2m/evaluation/randomization.py); ``r2m compare``.

Expectations from outside the code: mid-p values enumerated by hand over all 2^4 swaps of four images,
the same counts from a plain loop over explicitly swapped systems (BLEU's corpus form), Holm's
adjusted p-values of a hand-made vector, planted nulls whose rate of marks must be 5 % ± 3 Monte-Carlo
standard errors (CR≥1 at 16 images: the sign test's rate worked out with binomial arithmetic)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from r2m.evaluation import bootstrap as B
from r2m.evaluation import randomization as RZ
from test_bootstrap import _compare_files, _rows, corpus  # noqa: F401
from test_evaluation import no_spice, shared_meteor_pool  # noqa: F401


def _mean_system(ids, **cols) -> B.PerImage:
    return B.PerImage(tuple(ids), {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()})


# --------------------------------------------------------------------------- hand-worked p
def test_four_images_every_swap_enumerated_by_hand():
    """CIDEr differences B − A per image 3, 2, −1, 1 (observed mean 1.25, sum 5). A swap flips an
    image's sign. With s1 = s2 = + the sum is 5 + (−s3 + s4) ∈ {5, 3, 7, 5}: one above 5 (7), two
    equal (5, 5); s1 = s2 = − mirrors it; mixed signs give |sum| ≤ 3. Of 16 patterns: 2 greater, 4
    ties; mid-p = (2 + 4/2) / 16 = 4/16 (the conventional p counts ties whole: 6/16). ROUGE-L
    differences 1, 2, 3, 4: only all-plus and all-minus reach |10|, both ties: mid-p = 1/16 (2/16)."""
    ids = "abcd"
    a = _mean_system(ids, CIDEr=[0, 0, 0, 0], ROUGE_L=[0, 0, 0, 0])
    b = _mean_system(ids, CIDEr=[3, 2, -1, 1], ROUGE_L=[1, 2, 3, 4])
    got = RZ.randomization_test(a, b, trials=10_000)
    c, r = got["CIDEr"], got["ROUGE_L"]
    assert c.exact and c.trials == 16
    assert (c.delta, c.greater, c.ties, c.p, c.p_conventional) == (1.25, 2, 4, 4 / 16, 6 / 16)
    assert (r.delta, r.greater, r.ties, r.p, r.p_conventional) == (2.5, 0, 2, 1 / 16, 2 / 16)
    # swapping A and B changes the sign of the difference, not the p
    back = RZ.randomization_test(b, a, trials=10_000)
    assert back["CIDEr"].delta == -1.25 and back["CIDEr"].p == 4 / 16
    # no difference at all: every swap ties, p = 1 (not the mid-p's 1/2)
    same = RZ.randomization_test(a, a, trials=10_000)["CIDEr"]
    assert (same.delta, same.p, same.p_conventional) == (0.0, 1.0, 1.0)


def test_sampled_trials_agree_with_the_enumeration():
    """12 images: 2,000 random trials estimate the exact mid-p (all 4,096 swaps, counted by a plain
    loop) within 4 binomial standard errors; sampled mid-p = (greater + (ties + 1)/2) / (trials + 1)."""
    rng = np.random.default_rng(3)
    d = rng.normal(0.3, 1.0, 12)
    b = _mean_system([str(i) for i in range(12)], CIDEr=d)
    a = _mean_system(b.ids, CIDEr=np.zeros(12))
    sums = [abs(sum(s * x for s, x in zip(signs, d, strict=True))) for signs in itertools.product((1, -1), repeat=12)]
    obs = abs(d.sum())
    greater = sum(v > obs + 1e-12 for v in sums)
    ties = sum(abs(v - obs) <= 1e-12 for v in sums)
    assert ties == 2  # continuous differences: only the observed assignment and its mirror image tie
    exact = (greater + ties / 2) / 4096
    got = RZ.randomization_test(a, b, trials=2000, seed=5)["CIDEr"]
    assert not got.exact and got.trials == 2000 and got.p == (got.greater + (got.ties + 1) / 2) / 2001
    assert abs(got.count / 2000 - exact) < 4 * math.sqrt(exact * (1 - exact) / 2000)
    full = RZ.randomization_test(a, b, trials=4096)["CIDEr"]
    assert full.exact and (full.greater, full.ties) == (greater, ties) and full.p == exact


def test_bleu_is_tested_on_its_corpus_form():
    """Five images of BLEU counts: every one of the 32 swaps rebuilt as two explicit systems and scored by
    corpus_metrics (summed counts, geometric mean, brevity penalty); the count of |ΔBLEU| ≥ |observed|
    equals the vectorised test's."""
    rng = np.random.default_rng(1)

    def counts():
        guess = rng.integers(6, 12, size=(5, 1)) - np.arange(4)[None, :]
        correct = np.minimum(guess, rng.integers(0, 7, size=(5, 4)))
        testlen = guess[:, 0]
        cols = {"bleu_testlen": testlen, "bleu_reflen": testlen + rng.integers(-2, 4, size=5)}
        cols.update({f"bleu_guess_{k + 1}": guess[:, k] for k in range(4)})
        cols.update({f"bleu_correct_{k + 1}": correct[:, k] for k in range(4)})
        return _mean_system("vwxyz", **cols)

    a, b = counts(), counts()
    metrics = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]
    obs = {m: float(B.corpus_metrics(b, metrics=metrics)[m] - B.corpus_metrics(a, metrics=metrics)[m]) for m in metrics}
    hits = dict.fromkeys(metrics, 0)
    for mask in itertools.product((False, True), repeat=5):
        m_ = np.array(mask)
        sa = B.PerImage(a.ids, {c: np.where(m_, b.columns[c], a.columns[c]) for c in a.columns})
        sb = B.PerImage(a.ids, {c: np.where(m_, a.columns[c], b.columns[c]) for c in a.columns})
        va, vb = B.corpus_metrics(sa, metrics=metrics), B.corpus_metrics(sb, metrics=metrics)
        for m in metrics:
            hits[m] += abs(float(vb[m] - va[m])) >= abs(obs[m]) - 1e-12
    got = RZ.randomization_test(a, b, trials=100, metrics=metrics)
    for m in metrics:
        assert got[m].exact and got[m].delta == pytest.approx(obs[m], abs=1e-12)
        assert got[m].count == hits[m], m


# --------------------------------------------------------------------------- Holm, p text, limits
def test_holm_on_a_hand_made_vector():
    """p = 0.01, 0.04, 0.03, 0.005: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → 0.06
    (monotone). At 0.05: 0.005 ≤ 0.0125 and 0.01 ≤ 0.0167 rejected, 0.03 > 0.025 stops."""
    assert RZ.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert RZ.holm({"x": 0.5, "y": 0.001}) == pytest.approx({"x": 0.5, "y": 0.002})
    assert RZ.holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])
    with pytest.raises(ValueError):
        RZ.holm([1.2])


def test_p_text_never_claims_below_its_floor():
    assert RZ.p_text(1 / 1001, 1 / 1001) == "p≤0.001"
    assert RZ.p_text(0.002, 0.002) == "p≤0.002"  # a floor of 0.002 is never printed as p<0.001
    assert RZ.p_text(0.0342, 1 / 10001) == "p=0.034"
    assert RZ.p_text(1.0, 0.001) == "p=1"


def test_counts_outside_the_limits():
    assert RZ.min_resamples(0.95) == 200 and RZ.min_resamples(0.9) == 100
    assert "below the floor of 200" in RZ.check_count("resamples", 3, 200, B.MAX_RESAMPLES)
    assert RZ.check_count("trials", 999, RZ.MIN_TRIALS, RZ.MAX_TRIALS) is None
    with pytest.raises(ValueError, match="above the limit"):
        RZ.check_count("resamples", 10**8, 200, B.MAX_RESAMPLES)
    with pytest.raises(ValueError, match="above the limit"):
        B.bootstrap_ci(_mean_system("ab", CIDEr=[1, 2]), resamples=10**8)


# --------------------------------------------------------------------------- calibration
def _with_concepts(r1: B.PerImage, r2: B.PerImage, seed: int = 11) -> tuple[B.PerImage, B.PerImage]:
    """Concept counts like ``r2m bench significance``'s: each image has 0–5 input concepts (the same for
    both runs) and each run's caption names ``floor(given · U)`` of them (U uniform, independent per run)."""
    rng = np.random.default_rng(seed)
    given = rng.integers(0, 6, size=r1.n).astype(np.float64)
    return tuple(B.PerImage(r.ids, dict(r.columns, concept_given=given, concept_named=np.floor(given * rng.random(r.n))))
                 for r in (r1, r2))


def _null_rates(r1: B.PerImage, r2: B.PerImage, n: int, pairs: int, seed: int) -> dict[str, float]:
    """Each pair: n images drawn without replacement; each image's two captions go to A and B in a
    random order (exchangeable by construction)."""
    rng = np.random.default_rng(seed)
    metrics = r1.metrics()
    hits = dict.fromkeys(metrics, 0)
    for k in range(pairs):
        rows = rng.choice(r1.n, size=n, replace=False)
        flip = rng.random(n) < 0.5
        a = B.PerImage(tuple(r1.ids[r] for r in rows),
                       {c: np.where(flip, r2.columns[c][rows], r1.columns[c][rows]) for c in r1.columns})
        b = B.PerImage(a.ids, {c: np.where(flip, r1.columns[c][rows], r2.columns[c][rows]) for c in r1.columns})
        for m, t in RZ.randomization_test(a, b, trials=999, seed=k).items():
            hits[m] += t.p <= 0.05
    return {m: h / pairs for m, h in hits.items()}


def _sign_test_rate(discordant: int, pool: int, n: int, alpha: float = 0.05) -> float:
    """Expected share of planted nulls of ``n`` of ``pool`` images a mid-p sign test marks, when
    ``discordant`` images of the pool differ (one run names a concept, the other none). CR≥1 is such a
    test: B − A is (sum of ±1 over the discordant images drawn) / (images with a concept), the same
    denominator for every swap. Drawn discordant images m: hypergeometric; given m, S = sum of m fair
    ±1, and the mid-p of |S| = s is P(|S| > s) + P(|S| = s) / 2. Plain binomial arithmetic."""
    def p_abs(m: int, s: int) -> float:  # P(|S| = s), S = 2 · Binomial(m, 1/2) − m
        if (m + s) % 2:
            return 0.0
        return math.comb(m, (m + s) // 2) / 2**m * (1 if s == 0 else 2)

    total = 0.0
    for m in range(0, min(n, discordant) + 1):
        weight = math.comb(discordant, m) * math.comb(pool - discordant, n - m) / math.comb(pool, n)
        if m == 0 or weight < 1e-12:
            continue
        for s in range(1, m + 1):
            mid = sum(p_abs(m, u) for u in range(s + 1, m + 1)) + p_abs(m, s) / 2
            if mid <= alpha:
                total += weight * p_abs(m, s)
    return total


@pytest.mark.parametrize("n", [16, 300])
def test_planted_null_marks_at_the_nominal_rate(corpus, n):  # noqa: F811
    """400 planted nulls: each metric's share of p ≤ 0.05 lies within 5 % ± 3 Monte-Carlo SE
    (1.7–8.3 %), the concept metrics included — except CR≥1 at 16 images, whose rate the mid-p
    cannot lift to 5 %: about half the draws have ≤ 4 discordant images, where no sign pattern has a
    mid-p ≤ 0.05 (all four alike: 1/16). There, and at 300 images, its rate must be the sign test's
    rate worked out with binomial arithmetic (:func:`_sign_test_rate`) within 3 binomial SE, and never
    above 5 % + 3 SE."""
    _, _, runs = corpus
    r1, r2 = _with_concepts(*runs)
    pairs = 400
    rates = _null_rates(r1, r2, n, pairs, seed=n)
    print(f"planted-null rate at n={n} over {pairs} pairs:", rates)
    se = math.sqrt(0.05 * 0.95 / pairs)
    assert set(rates) >= {"Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "concept_recall", "concept_any"}
    for m, r in rates.items():
        assert r <= 0.05 + 3 * se, (m, r)
        if not (m == "concept_any" and n == 16):
            assert 0.05 - 3 * se <= r, (m, r)
    has = r1.columns["concept_given"] > 0
    discordant = int(np.count_nonzero(has & ((r1.columns["concept_named"] > 0) != (r2.columns["concept_named"] > 0))))
    expected = _sign_test_rate(discordant, r1.n, n)
    print(f"CR≥1: {discordant} of {r1.n} images discordant; sign-test rate {expected:.4f}")
    assert abs(rates["concept_any"] - expected) <= 3 * math.sqrt(expected * (1 - expected) / pairs)
    if n == 16:
        assert expected < 0.05 - 3 * math.sqrt(0.05 * 0.95 / 1000)  # below the band: the known shortfall


def test_better_on_every_image_is_marked_at_16_images(corpus):  # noqa: F811
    """B captions each image with one of its references: better on every image; 16 images, 999 trials."""
    refs, _, (a, _) = corpus
    b, _ = _rows({i: refs[i][0] for i in refs}, refs)
    worse = np.flatnonzero(a.columns["ROUGE_L"] < 1)[:16]
    a, b = a.take(worse), b.take(worse)
    assert (b.columns["CIDEr"] > a.columns["CIDEr"]).all()
    got = RZ.randomization_test(a, b, trials=999)
    for m, t in got.items():  # no trial reaches the observed difference: the observed half-tie alone
        assert t.delta > 0 and t.p == t.floor == 0.5 / 1000 and t.p <= 0.05, m


# --------------------------------------------------------------------------- r2m compare
def test_compare_takes_several_seeds_per_system_and_refuses_counts_outside_the_limits(
        tmp_path, capsys, no_spice, shared_meteor_pool):  # noqa: F811
    """Three systems of one run each: every metric's family holds its two differences against A (Holm). Two
    systems of two runs each (``--system``): the seed terms enter — A's two runs are one file twice, so A's
    seed variance is 0 and B's (a run and a worse run) is the variance of its two corpus values."""
    from r2m.cli import main

    refs, a = _compare_files(tmp_path)
    assert main(["compare", "--references", str(refs), str(a), str(a), str(a), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["family"] == 2 and "Holm" in out["correction"]
    d = out["differences"][1]["metrics"]["CIDEr"]
    assert (d["delta"], d["p"], d["p_holm"], d["mark"], d["family"]) == (0.0, 1.0, 1.0, "n.s.", 2)
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps([{"image_id": i["image_id"], "caption": "a"} for i in json.loads(a.read_text())]))
    assert main(["compare", "--references", str(refs), "--system", str(a), str(a), "--system", str(a), str(worse),
                 "--json", "--scorers", "bleu,cider"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = out["differences"][0]["metrics"]["CIDEr"]
    values = [s["metrics"]["CIDEr"]["value"] for s in out["systems"]]
    assert d["runs"] == [2, 2] and d["components"]["seed_a"] == 0.0
    assert d["delta"] == pytest.approx(values[1] - values[0], abs=1e-12)
    assert out["systems"][1]["paths"] == [str(a), str(worse)]
    # one resample: no interval, no mark
    assert main(["compare", "--references", str(refs), str(a), str(a), "--resamples", "1"]) == 0
    text = capsys.readouterr().out
    assert "resamples 1 below the floor of 200: no interval printed" in text
    line = next(x for x in text.splitlines() if "B − A" in x)
    assert "[no interval]" in line and " * " not in line and "n.s." not in line
    with pytest.raises(SystemExit) as stop:
        main(["compare", "--references", str(refs), str(a), str(a), "--resamples", "100000000"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "at most 1,000,000" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        main(["compare", "--references", str(refs), str(a), "--system", str(a)])
    assert "either as RESULTS" in capsys.readouterr().err
